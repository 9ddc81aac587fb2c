"""What a person sees when Tandem hits an unhandled error: what happened and the log's path."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QApplication, QMessageBox


def crash_text(error: str, log_path: Path | None) -> str:
    where = f"The details are in {log_path}" if log_path else "The log could not be written; details went to stderr"
    return (f"Tandem hit an unexpected error and may not work correctly until restarted.\n\n{error}\n\n"
            f"{where}: please attach that file when reporting the problem.")


def show_crash(error: str, log_path: Path | None) -> QMessageBox | None:
    """A non-blocking message box (the event loop goes on); None when no GUI is running."""
    if QApplication.instance() is None:
        return None
    box = QMessageBox(QMessageBox.Icon.Critical, "Tandem: unexpected error", crash_text(error, log_path))
    box.setModal(False)
    box.show()
    show_crash.last = box  # kept alive until the next one
    return box
