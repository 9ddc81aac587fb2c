"""Help ▸ About: the version, the kernels this machine runs (fetched on the engine thread:
kernels imports torch) and the log folder, with a button that opens it."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPushButton, QVBoxLayout


def app_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tandem")
    except PackageNotFoundError:  # a source checkout or a packaged build without metadata
        import tomllib

        from engine.core.paths import RESOURCES

        pyproject = Path(RESOURCES).parent / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, ValueError):
            return "unknown"


class AboutDialog(QDialog):
    def __init__(self, log_folder: Path, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About Tandem")
        self.log_folder = Path(log_folder)
        col = QVBoxLayout(self)
        self.title = QLabel(f"<span style='font-size:18px; font-weight:700'>Tandem {app_version()}</span><br>"
                            "Fast local models with lossless speculative decoding.")
        self.kernels = QLabel("Kernels: asking the engine…")
        self.kernels.setWordWrap(True)
        self.logs = QLabel(f"Logs: {self.log_folder}")
        self.logs.setWordWrap(True)
        self.open_logs = QPushButton("Open log folder")
        self.open_logs.clicked.connect(self.open_log_folder)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        for widget in (self.title, self.kernels, self.logs, self.open_logs, buttons):
            col.addWidget(widget)
        self.setMinimumWidth(520)

    def show_kernels(self, text: str) -> None:
        self.kernels.setText("Kernels: " + text)

    def open_log_folder(self) -> bool:
        self.log_folder.mkdir(parents=True, exist_ok=True)
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.log_folder)))
