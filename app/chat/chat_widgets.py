"""Small widgets of the chat tab: the message box, the attachment chips and the non-modal notice bars."""
from __future__ import annotations

from PySide6.QtCore import QMimeData, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QStyle,
    QToolButton,
    QWidget,
)

SEND_ON_ENTER = "Message the model (Enter to send, Shift+Enter for a new line)"
SEND_ON_CTRL_ENTER = "Message the model (Ctrl+Enter to send, Enter for a new line)"


class ChatInput(QPlainTextEdit):
    """Enter sends and Shift+Enter starts a new line; with ``ctrl_enter_sends`` Ctrl+Enter sends
    and Enter starts a new line. Ctrl+Enter sends either way."""

    submitted = Signal()
    #: Local files dropped or pasted onto the box (their paths): attached, not typed in as addresses.
    files_dropped = Signal(list)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.ctrl_enter_sends = False
        self.setPlaceholderText(SEND_ON_ENTER)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 (Qt's name)
        return bool(local_files(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 (Qt's name)
        if paths := local_files(source):
            self.files_dropped.emit(paths)
            return
        super().insertFromMimeData(source)

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


def local_files(mime: QMimeData | None) -> list[str]:
    """The local file paths a drag or a paste carries (none for text or web addresses)."""
    if mime is None or not mime.hasUrls():
        return []
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile() and url.toLocalFile()]


class AttachmentChip(QFrame):
    """One attached file in the composer: its name, its token count (or "reading…"), and ✕."""

    removed = Signal(int)

    def __init__(self, key: int, name: str, parent=None) -> None:
        super().__init__(parent)
        self.key = key
        self.name = name
        self.setObjectName("chip")
        self.setStyleSheet("#chip { background: #e8f0fe; border: 1px solid #c6dafc; border-radius: 10px; }")
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 1, 2, 1)
        row.setSpacing(4)
        icon = QLabel()
        icon.setPixmap(self.style().standardIcon(QStyle.StandardPixmap.SP_FileIcon).pixmap(14, 14))
        row.addWidget(icon)
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setAutoRaise(True)
        self.close_button.setToolTip(f"Remove {name}")
        row.addWidget(self.label)
        row.addWidget(self.close_button)
        self.close_button.clicked.connect(lambda: self.removed.emit(self.key))
        self.set_state("reading…")

    def set_state(self, detail: str, tooltip: str = "") -> None:
        self.label.setText(f"{self.name} · {detail}")
        self.setToolTip(tooltip or self.name)


class AttachmentStrip(QScrollArea):
    """The row of chips above the message box, scrolled sideways when many files never fit;
    hidden while nothing is attached."""

    removed = Signal(int)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setWidgetResizable(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        self.setWidget(inner)
        self.setFixedHeight(inner.fontMetrics().height() + 14 + self.horizontalScrollBar().sizeHint().height())
        self.row = QHBoxLayout(inner)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(6)
        self.row.addStretch(1)
        self.chips: dict[int, AttachmentChip] = {}
        self.hide()

    def add(self, key: int, name: str) -> AttachmentChip:
        chip = AttachmentChip(key, name)
        chip.removed.connect(self.removed)
        self.row.insertWidget(self.row.count() - 1, chip)
        self.chips[key] = chip
        self.show()
        return chip

    def remove(self, key: int) -> None:
        chip = self.chips.pop(key, None)
        if chip is not None:
            self.row.removeWidget(chip)
            chip.deleteLater()
        self.setVisible(bool(self.chips))

    def clear(self) -> None:
        for key in list(self.chips):
            self.remove(key)
