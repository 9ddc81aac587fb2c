"""Multi-turn chat with the loaded model; speculation on by default; history saved on disk."""
from __future__ import annotations

import html

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.conversations import Conversation, ConversationStore
from engine.core.events import Failed, Finished, Stats, Tokens


class ChatInput(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line."""

    submitted = Signal()

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


def _bubble(role: str, content: str, note: str = "") -> str:
    # pre-wrap: HTML would collapse the leading spaces that indent a reply's code.
    text = (f"<div style='white-space:pre-wrap'>{html.escape(content)}</div>" if content
            else "<i style='color:#999'>…</i>")
    if role == "user":
        return (f"<table width='100%' cellspacing='0'><tr><td width='20%'></td><td bgcolor='#e8f0fe' "
                f"style='padding:8px'>{text}</td></tr></table>")
    foot = f"<div style='color:#888; font-size:10px'>{html.escape(note)}</div>" if note else ""
    return (f"<table width='100%' cellspacing='0'><tr><td bgcolor='#f1f3f4' style='padding:8px; font-family:monospace'>"
            f"{text}{foot}</td><td width='10%'></td></tr></table>")


class ChatView(QWidget):
    send_requested = Signal(object, object, str)  # messages, DecodeSettings, drafter kind
    stop_requested = Signal()

    def __init__(self, store: ConversationStore, controls, parent=None) -> None:
        super().__init__(parent)
        self.store = store
        self.controls = controls  # DecodeControls from the demo: one set of decoding choices
        self.conversations: list[Conversation] = store.load_all()
        self.current: Conversation | None = None
        self.streaming: dict | None = None
        self.running = False
        self.ready = False

        left = QWidget()
        left_col = QVBoxLayout(left)
        left_col.setContentsMargins(0, 0, 0, 0)
        self.new_button = QPushButton("New chat")
        self.list = QListWidget()
        self.delete_button = QPushButton("Delete")
        left_col.addWidget(self.new_button)
        left_col.addWidget(self.list, 1)
        left_col.addWidget(self.delete_button)

        right = QWidget()
        col = QVBoxLayout(right)
        col.setContentsMargins(0, 0, 0, 0)
        self.transcript = QTextBrowser()
        self.transcript.setOpenExternalLinks(False)
        self.input = ChatInput()
        self.input.setPlaceholderText("Message the model (Enter to send, Shift+Enter for a new line)")
        self.input.setFixedHeight(80)
        row = QHBoxLayout()
        self.speculation = QCheckBox("Speculation")
        self.speculation.setChecked(True)
        self.speculation.setToolTip("Draft with the drafter chosen on the Side-by-side tab; the reply is the same either way.")
        self.stats = QLabel("")
        self.stats.setStyleSheet("color: #555;")
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.regenerate_button = QPushButton("Regenerate")
        self.copy_button = QPushButton("Copy reply")
        row.addWidget(self.speculation)
        row.addWidget(self.stats, 1)
        for b in (self.copy_button, self.regenerate_button, self.stop_button, self.send_button):
            row.addWidget(b)
        col.addWidget(self.transcript, 1)
        col.addWidget(self.input)
        col.addLayout(row)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([200, 800])
        outer = QVBoxLayout(self)
        outer.addWidget(split)

        self.new_button.clicked.connect(self.new_chat)
        self.delete_button.clicked.connect(self.delete_chat)
        self.list.currentRowChanged.connect(self._select)
        self.send_button.clicked.connect(self.send)
        self.input.submitted.connect(self.send)
        self.stop_button.clicked.connect(self.stop_requested)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button.clicked.connect(self.copy_reply)
        QShortcut(QKeySequence.StandardKey.New, self, activated=self.new_chat)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(50)  # coalesce bursts of tokens into one repaint
        self._render_timer.timeout.connect(self.render)

        self._fill_list()
        if self.conversations:
            self.list.setCurrentRow(0)
        else:
            self.new_chat()
        self._sync_buttons()

    # --- conversations ------------------------------------------------------------------------
    def _fill_list(self) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for c in self.conversations:
            item = QListWidgetItem(c.title)
            item.setToolTip(c.title)
            self.list.addItem(item)
        self.list.blockSignals(False)

    def _select(self, row: int) -> None:
        if self.running or not 0 <= row < len(self.conversations):
            return
        self.current = self.conversations[row]
        self.render()
        self._sync_buttons()

    def new_chat(self) -> None:
        if self.running:
            return
        if self.current is not None and not self.current.messages:
            self.input.setFocus()
            return  # already on an empty chat
        self.current = Conversation()
        self.conversations.insert(0, self.current)
        self._fill_list()
        self.list.setCurrentRow(0)
        self.render()
        self.input.setFocus()

    def delete_chat(self) -> None:
        if self.running or self.current is None:
            return
        self.store.delete(self.current.id)
        self.conversations.remove(self.current)
        self.current = None
        self._fill_list()
        if self.conversations:
            self.list.setCurrentRow(0)
        else:
            self.new_chat()

    # --- sending ------------------------------------------------------------------------------
    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        self._sync_buttons()

    def _sync_buttons(self) -> None:
        has_reply = bool(self.current and self.current.messages and self.current.messages[-1]["role"] == "assistant")
        self.send_button.setEnabled(self.ready and not self.running)
        self.stop_button.setEnabled(self.running)
        self.regenerate_button.setEnabled(self.ready and not self.running and has_reply)
        self.copy_button.setEnabled(has_reply)
        self.new_button.setEnabled(not self.running)
        self.delete_button.setEnabled(not self.running)

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or not self.ready or self.running or self.current is None:
            return
        self.current.messages.append({"role": "user", "content": text})
        if self.current.title == "New chat":
            self.current.title = text.splitlines()[0][:48]
            self._fill_list()
            self.list.setCurrentRow(self.conversations.index(self.current))
        self.store.save(self.current)  # the user's words are on disk before we generate
        self.input.clear()
        self._start_reply()

    def regenerate(self) -> None:
        if self.running or not self.current or not self.current.messages or self.current.messages[-1]["role"] != "assistant":
            return
        self.current.messages.pop()
        self.store.save(self.current)
        self._start_reply()

    def _start_reply(self) -> None:
        self.running = True
        self.streaming = {"role": "assistant", "content": ""}
        self.stats.setText("generating…")
        drafter = self.controls.drafter_kind() if self.speculation.isChecked() else "off"
        self.send_requested.emit(self.current.chat_messages(), self.controls.settings(), drafter)
        self.render()
        self._sync_buttons()

    def copy_reply(self) -> None:
        if self.current and self.current.messages and self.current.messages[-1]["role"] == "assistant":
            QGuiApplication.clipboard().setText(self.current.messages[-1]["content"])
            self.stats.setText("reply copied")

    # --- engine events ------------------------------------------------------------------------
    def on_lane_event(self, item) -> None:
        event = item.event
        if self.streaming is None:
            return
        if isinstance(event, Tokens):
            self.streaming["content"] += event.text
            self._render_timer.start()
        elif isinstance(event, Stats):
            s = event.stats
            self.stats.setText(self._describe(s))
        elif isinstance(event, Finished):
            note = self._describe(event.stats) + (" · stopped" if event.reason == "cancelled" else "")
            self.current.messages.append({"role": "assistant", "content": event.text, "stats": note})
            self.store.save(self.current)
            self._end(note)
        elif isinstance(event, Failed):
            self._end("")

    def job_ended(self) -> None:
        """The worker finished the job (also after a failure or cancel before any event)."""
        if self.running:
            self._end(self.stats.text() if self.streaming is None else "")

    def _end(self, note: str) -> None:
        self.streaming = None
        self.running = False
        self.stats.setText(note)
        self.render()
        self._sync_buttons()

    @staticmethod
    def _describe(s) -> str:
        text = f"{s.tok_per_s:.1f} tok/s · {s.new_tokens} token{'' if s.new_tokens == 1 else 's'}"
        if s.drafted:
            text += f" · {s.acceptance:.0%} of drafted tokens accepted"
        return text

    def render(self) -> None:
        if self.current is None:
            self.transcript.clear()
            return
        parts = [_bubble(m["role"], m["content"], m.get("stats", "")) for m in self.current.messages]
        if self.streaming is not None:
            parts.append(_bubble("assistant", self.streaming["content"]))
        if not parts:
            parts.append("<p style='color:#888'>Start a conversation. Replies use speculative decoding: "
                         "same text as the model alone, sooner.</p>")
        self.transcript.setHtml("<div style='height:6px'></div>".join(parts))
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())
