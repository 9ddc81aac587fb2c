"""Small widgets of the chat tab: the message box and the non-modal notice bars."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
)

SEND_ON_ENTER = "Message the model (Enter to send, Shift+Enter for a new line)"
SEND_ON_CTRL_ENTER = "Message the model (Ctrl+Enter to send, Enter for a new line)"


class ChatInput(QPlainTextEdit):
    """Enter sends and Shift+Enter starts a new line; with ``ctrl_enter_sends`` Ctrl+Enter sends
    and Enter starts a new line. Ctrl+Enter sends either way."""

    submitted = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.ctrl_enter_sends = False
        self.setPlaceholderText(SEND_ON_ENTER)

    def set_ctrl_enter_sends(self, on: bool) -> None:
        self.ctrl_enter_sends = on
        self.setPlaceholderText(SEND_ON_CTRL_ENTER if on else SEND_ON_ENTER)

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            modifiers = event.modifiers()
            ctrl = bool(modifiers & Qt.KeyboardModifier.ControlModifier)
            shift = bool(modifiers & Qt.KeyboardModifier.ShiftModifier)
            if ctrl or not (shift or self.ctrl_enter_sends):
                self.submitted.emit()
                return
            self.insertPlainText("\n")  # Shift+Enter would otherwise insert a line separator
            return
        super().keyPressEvent(event)


class NoticeBar(QFrame):
    """A one-line, non-modal bar with an optional action button; hides itself after a while."""

    action = Signal()
    closed = Signal()

    def __init__(self, action_text: str = "", background: str = "#e8f0fe", parent=None) -> None:
        super().__init__(parent)
        self.setStyleSheet(f"NoticeBar {{ background: {background}; border-radius: 4px; }}")
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 4, 4, 4)
        self.text = QLabel()
        self.text.setTextFormat(Qt.TextFormat.PlainText)
        self.button = QPushButton(action_text)
        self.button.setVisible(bool(action_text))
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        row.addWidget(self.text, 1)
        row.addWidget(self.button)
        row.addWidget(close)
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.timeout.connect(self.dismiss)
        self.button.clicked.connect(self._act)
        close.clicked.connect(self.dismiss)
        self.hide()

    def show_message(self, text: str, seconds: float = 0) -> None:
        """Show ``text``; with ``seconds`` the bar goes away by itself after that long."""
        self.text.setText(text)
        self.show()
        if seconds:
            self.timer.start(int(seconds * 1000))
        else:
            self.timer.stop()

    def dismiss(self) -> None:
        self.timer.stop()
        if not self.isHidden():  # isVisible() is False on a tab not shown, yet the bar is up
            self.hide()
            self.closed.emit()

    def _act(self) -> None:
        self.timer.stop()
        self.hide()
        self.action.emit()
