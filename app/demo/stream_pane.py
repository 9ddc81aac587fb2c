"""A read-only text pane that streams a reply, colouring text by where its tokens came from."""
from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextEdit

DRAFT_BACKGROUND = QColor("#c8efd2")  # accepted from the drafter
DIVERGENCE_COLOR = QColor("#d93025")


def monospace() -> QFont:
    font = QFont("monospace")
    font.setStyleHint(QFont.StyleHint.Monospace)
    font.setPointSize(10)
    return font


class StreamPane(QTextEdit):
    def clear(self) -> None:
        super().clear()
        self.marked = None

    def __init__(self, placeholder: str = "", parent=None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFont(monospace())
        self.setPlaceholderText(placeholder)
        self.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        self._plain = QTextCharFormat()
        self._draft = QTextCharFormat()
        self._draft.setBackground(DRAFT_BACKGROUND)
        self.marked: tuple[int, int] | None = None

    def append_segments(self, segments) -> None:
        """``segments``: objects with ``text`` and ``from_draft`` (engine.decode.token_origin.Segment)."""
        bar = self.verticalScrollBar()
        follow = bar.value() >= bar.maximum() - 4  # keep following unless the user scrolled up
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for segment in segments:
            cursor.insertText(segment.text, self._draft if segment.from_draft else self._plain)
        if follow:
            bar.setValue(bar.maximum())

    def mark_from(self, offset: int, tooltip: str) -> None:
        """Underline the text from ``offset`` to the end of the word there (the first token that
        differs from the other pane) and explain it on hover."""
        text = self.toPlainText()
        if offset >= len(text):
            self.append_segments([_Marker("⟂")])
            offset = len(self.toPlainText()) - 1
        end = offset + 1
        while end < len(text) and end - offset < 12 and not text[end].isspace():
            end += 1
        cursor = QTextCursor(self.document())
        cursor.setPosition(offset)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        fmt = QTextCharFormat()
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
        fmt.setUnderlineColor(DIVERGENCE_COLOR)
        fmt.setForeground(DIVERGENCE_COLOR)
        fmt.setFontWeight(QFont.Weight.Bold)
        fmt.setToolTip(tooltip)
        cursor.mergeCharFormat(fmt)
        cursor.clearSelection()  # scroll to it without a selection highlight hiding the mark
        self.setTextCursor(cursor)
        self.ensureCursorVisible()
        self.marked = (offset, end)


class _Marker:
    from_draft = False

    def __init__(self, text: str) -> None:
        self.text = text
