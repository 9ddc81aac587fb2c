"""The chat's Tools dialog: the MCP servers whose tools the model may call, and whether each
call is confirmed first (on by default)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.store.tool_settings import BadToolSettings, McpEntry, ToolSettings

HELP = ("MCP servers that run on this computer (stdio). Each is a command line, run without a shell: "
        "for example <code>npx -y @modelcontextprotocol/server-filesystem ~/notes</code> or "
        "<code>uvx mcp-server-fetch</code>. A server's tools are offered to the model in every chat "
        "while it is on. A tool can read or change what its server can reach: add only servers you trust.")
ON, NAME, COMMAND = range(3)


class ToolsDialog(QDialog):
    def __init__(self, tools: ToolSettings, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Tools (MCP servers)")
        self.resize(720, 360)
        self.result_settings: ToolSettings | None = None
        intro = QLabel(HELP)
        intro.setWordWrap(True)
        intro.setTextFormat(Qt.TextFormat.RichText)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["On", "Name", "Command"])
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(ON, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COMMAND, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        self.add_button = QPushButton("Add server")
        self.remove_button = QPushButton("Remove")
        self.confirm = QCheckBox("Ask me before each tool call runs (recommended)")
        self.confirm.setChecked(tools.confirm)
        self.error = QLabel("")
        self.error.setStyleSheet("color: #c5221f;")
        self.error.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        row = QHBoxLayout()
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        row.addStretch(1)
        col = QVBoxLayout(self)
        for w in (intro, self.table):
            col.addWidget(w, 1 if w is self.table else 0)
        col.addLayout(row)
        for w in (self.confirm, self.error, self.buttons):
            col.addWidget(w)
        for server in tools.servers:
            self.add_row(server)
        self.add_button.clicked.connect(lambda: self.add_row(McpEntry(self._free_name(), "")))
        self.remove_button.clicked.connect(self._remove_selected)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

    def add_row(self, server: McpEntry) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        on = QTableWidgetItem()
        on.setFlags(Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
        on.setCheckState(Qt.CheckState.Checked if server.enabled else Qt.CheckState.Unchecked)
        self.table.setItem(row, ON, on)
        self.table.setItem(row, NAME, QTableWidgetItem(server.name))
        self.table.setItem(row, COMMAND, QTableWidgetItem(server.command))
        if not server.command:
            self.table.setCurrentCell(row, COMMAND)
            self.table.editItem(self.table.item(row, COMMAND))

    def _free_name(self) -> str:
        names = {self.table.item(r, NAME).text() for r in range(self.table.rowCount())}
        return next(f"server {i}" for i in range(1, 100) if f"server {i}" not in names)

    def _remove_selected(self) -> None:
        for row in sorted({i.row() for i in self.table.selectedIndexes()}, reverse=True):
            self.table.removeRow(row)

    def settings(self) -> ToolSettings:
        """What the dialog shows, checked (BadToolSettings says what to fix)."""
        servers = tuple(McpEntry(self.table.item(r, NAME).text().strip(), self.table.item(r, COMMAND).text().strip(),
                                 self.table.item(r, ON).checkState() == Qt.CheckState.Checked)
                        for r in range(self.table.rowCount()))
        tools = ToolSettings(servers, self.confirm.isChecked())
        tools.check()
        return tools

    def accept(self) -> None:
        try:
            self.result_settings = self.settings()
        except BadToolSettings as exc:
            self.error.setText(f"Not saved: {exc}.")
            return
        super().accept()
