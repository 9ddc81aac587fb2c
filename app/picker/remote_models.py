"""Remote models on the Models tab: "Add remote server…" (URL, API key) lists the server's
/v1/models as models of source "remote"; their memory fit is "on the server"; "Use" makes one
the window's model (app/bridge/remote_jobs.py) so the chat talks to it.

The listing is HTTP, so it runs on a short-lived thread and comes back through a signal: the
GUI thread never waits on a server. Keys are kept in memory for the running app only.
"""
from __future__ import annotations

import threading

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

COLUMNS = ("Model", "Source", "Memory", "Server", "")


class AddRemoteDialog(QDialog):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add remote server")
        form = QFormLayout(self)
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://gpu-box:8000/v1 (vLLM, llama.cpp's server, tandem serve)")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("API key, if the server needs one")
        form.addRow("URL", self.url)
        form.addRow("API key", self.key)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)


class RemoteModelsBox(QGroupBox):
    use_requested = Signal(str, str, str)  # url, API key ("" for none), model id
    listed = Signal(str, object)  # url, list of RemoteModel or an error message (from the listing thread)

    def __init__(self, parent=None) -> None:
        super().__init__("Remote models", parent)
        self.keys: dict[str, str] = {}
        self.add_button = QPushButton("Add remote server…")
        self.add_button.clicked.connect(self._ask)
        self.status = QLabel("Models served by vLLM, llama.cpp's server or another Tandem, over the OpenAI API.")
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setStretchLastSection(False)
        self.table.setMaximumHeight(160)
        row = QHBoxLayout()
        row.addWidget(self.status, 1)
        row.addWidget(self.add_button)
        col = QVBoxLayout(self)
        col.addLayout(row)
        col.addWidget(self.table)
        self.listed.connect(self._show_listing)

    def _ask(self) -> None:
        dialog = AddRemoteDialog(self)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.add_server(dialog.url.text().strip(), dialog.key.text().strip())

    def add_server(self, url: str, api_key: str = "") -> None:
        if not url.startswith(("http://", "https://")):
            self.status.setText(f"{url!r} is not an http:// or https:// URL.")
            return
        self.keys[url] = api_key
        self.status.setText(f"Asking {url} for its models…")
        threading.Thread(target=self._list, args=(url, api_key), name="tandem-remote-models", daemon=True).start()

    def _list(self, url: str, api_key: str) -> None:
        from engine.remote.client import RemoteClient, RemoteEndpoint, RemoteError

        try:
            with RemoteClient(RemoteEndpoint(url, api_key or None), timeout_s=15.0) as client:
                self.listed.emit(url, client.list_models())
        except RemoteError as exc:
            self.listed.emit(url, str(exc))

    def _show_listing(self, url: str, models) -> None:
        if isinstance(models, str):
            self.status.setText(models)
            return
        for r in reversed(range(self.table.rowCount())):  # a server added again replaces its rows
            if self.table.item(r, 3).text() == url:
                self.table.removeRow(r)
        for model in models:
            r = self.table.rowCount()
            self.table.insertRow(r)
            for c, text in enumerate((model.id, "remote", "on the server", url)):
                self.table.setItem(r, c, QTableWidgetItem(text))
            use = QPushButton("Use")
            use.clicked.connect(lambda _=False, u=url, m=model.id: self.use_requested.emit(u, self.keys.get(u, ""), m))
            self.table.setCellWidget(r, 4, use)
        self.table.resizeColumnsToContents()
        self.status.setText(f"{url}: {len(models)} model{'s' if len(models) != 1 else ''}.")

    def rows(self) -> list[tuple[str, ...]]:
        return [tuple(self.table.item(r, c).text() for c in range(4)) for r in range(self.table.rowCount())]
