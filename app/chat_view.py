"""Multi-turn chat with the loaded model; speculation on by default; history saved on disk.

The tab holds the conversation list (search, rename, delete with undo, export and import), the
transcript (app/chat_transcript.py: Markdown replies, a copy button per code block), the preset and
settings panel (app/chat_settings.py) and the message box.
"""
from __future__ import annotations

import json
import logging

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import json_files
from app.app_settings import AppSettings, Key
from app.chat_library import ConversationActions
from app.chat_settings import CUSTOM, ChatSettingsPanel
from app.chat_transcript import Transcript
from app.chat_widgets import ChatInput, NoticeBar
from app.conversations import Conversation, ConversationStore
from app.markdown_view import code_blocks
from app.presets import Preset, PresetStore
from app.reply_stats import describe, describe_meta, reply_meta
from engine.core.events import Failed, Finished, Stats, Tokens

log = logging.getLogger(__name__)
STREAM_RENDER_MS = 80  # at most this often the streaming reply is laid out again


class ChatView(ConversationActions, QWidget):
    send_requested = Signal(object, object, str)  # messages, DecodeSettings, drafter kind
    stop_requested = Signal()

    def __init__(self, store: ConversationStore, presets: PresetStore, settings: AppSettings | None = None, parent=None) -> None:
        super().__init__(parent)
        self.store = store
        self.presets = presets
        self.settings = settings
        presets.install_bundled()
        self.conversations: list[Conversation] = store.load_all()
        self.current: Conversation | None = None
        self.streaming: dict | None = None
        self.running = False
        self.ready = False
        self.loaded = None  # app.messages.ModelLoaded: names the model in each reply's stats
        self.editing: int | None = None  # index of the earlier question being edited
        self.deleted: tuple[Conversation, bytes | None, int] | None = None  # what Undo puts back

        left = QWidget()
        left_col = QVBoxLayout(left)
        left_col.setContentsMargins(0, 0, 0, 0)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats (Ctrl+K)")
        self.search.setClearButtonEnabled(True)
        self.new_button = QPushButton("New chat")
        self.list = QListWidget()
        self.list.setEditTriggers(QListWidget.EditTrigger.DoubleClicked | QListWidget.EditTrigger.EditKeyPressed)
        self.delete_button = QPushButton("Delete")
        self.more_button = QToolButton()
        self.more_button.setText("Export / import ▾")
        self.more_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.more_button.setMenu(self._conversation_menu())
        self.undo_bar = NoticeBar("Undo", "#fef7e0")
        buttons = QHBoxLayout()
        buttons.addWidget(self.delete_button)
        buttons.addWidget(self.more_button)
        for w in (self.search, self.new_button, self.list):
            left_col.addWidget(w, 1 if w is self.list else 0)
        left_col.addWidget(self.undo_bar)
        left_col.addLayout(buttons)

        right = QWidget()
        col = QVBoxLayout(right)
        col.setContentsMargins(0, 0, 0, 0)
        self.panel = ChatSettingsPanel(presets)
        self.transcript = Transcript()
        self.edit_bar = NoticeBar("Cancel")
        self.input = ChatInput()
        self.input.setFixedHeight(80)
        row = QHBoxLayout()
        self.stats = QLabel("")
        self.stats.setStyleSheet("color: #555;")
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.regenerate_button = QPushButton("Regenerate")
        self.copy_button = QPushButton("Copy reply")
        row.addWidget(self.stats, 1)
        for b in (self.copy_button, self.regenerate_button, self.stop_button, self.send_button):
            row.addWidget(b)
        for w in (self.panel, self.transcript, self.edit_bar, self.input):
            col.addWidget(w, 1 if w is self.transcript else 0)
        col.addLayout(row)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([220, 800])
        outer = QVBoxLayout(self)
        outer.addWidget(split)

        self.new_button.clicked.connect(self.new_chat)
        self.delete_button.clicked.connect(self.delete_chat)
        self.undo_bar.action.connect(self.undo_delete)
        self.undo_bar.closed.connect(self._forget_deleted)
        self.list.currentRowChanged.connect(self._select)
        self.list.itemChanged.connect(self._renamed)
        self.search.textChanged.connect(self._filter)
        self.send_button.clicked.connect(self.send)
        self.input.submitted.connect(self.send)
        self.stop_button.clicked.connect(self.stop_requested)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button.clicked.connect(self.copy_reply)
        self.transcript.copy_requested.connect(self.copy_code)
        self.transcript.edit_requested.connect(self.begin_edit)
        self.edit_bar.action.connect(self.cancel_edit)
        self.panel.system_prompt_edited.connect(self._system_prompt_edited)
        self.panel.ctrl_enter.toggled.connect(self.input.set_ctrl_enter_sends)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self._escape, context=Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(STREAM_RENDER_MS)
        self._render_timer.timeout.connect(self._render_stream)
        self._save_timer = QTimer(self)
        self._save_timer.setSingleShot(True)
        self._save_timer.setInterval(600)  # a typed system prompt is saved once typing pauses
        self._save_timer.timeout.connect(self._save_current)

        self._restore_state()
        self._fill_list()
        if self.conversations:
            self.list.setCurrentRow(0)
        else:
            self.new_chat()
        self._sync_buttons()

    # --- settings -----------------------------------------------------------------------------
    def _restore_state(self) -> None:
        if self.settings is None:
            return
        self.panel.ctrl_enter.setChecked(self.settings.get(Key.CHAT_CTRL_ENTER, "false") in (True, "true"))
        self.panel.set_expanded(self.settings.get(Key.CHAT_PANEL_OPEN, "false") in (True, "true"))
        try:
            saved = Preset.from_json(json_files.loads(self.settings.get(Key.CHAT_SETTINGS, "") or "null"))
        except ValueError:
            return
        if self.panel.find(saved.name) is None:
            saved = Preset(**{**saved.to_json(), "name": CUSTOM})
        self.panel.apply(saved, with_system_prompt=False)
        self.panel.sync_preset_name()

    def save_state(self) -> None:
        if self.settings is None:
            return
        self.settings.set(Key.CHAT_SETTINGS, json.dumps(self.panel.current().to_json()))
        self.settings.set(Key.CHAT_CTRL_ENTER, self.panel.ctrl_enter.isChecked())
        self.settings.set(Key.CHAT_PANEL_OPEN, self.panel.toggle.isChecked())
        self._save_current()

    def decode_settings(self):
        return self.panel.current().decode_settings()

    def drafter_kind(self) -> str:
        """"model" is the loaded model's own drafter: a draft model, or its MTP layers."""
        kind = self.panel.drafter.currentData()
        if kind == "model" and self.loaded is not None:
            return self.loaded.drafter_kind
        return kind

    # --- conversations ------------------------------------------------------------------------
    def _select(self, row: int) -> None:
        if self.running or not 0 <= row < len(self.conversations):
            return
        self._save_current()
        self.cancel_edit()
        self.current = self.conversations[row]
        self.panel.show_system_prompt(self.current.system_prompt)
        self.render()
        self._sync_buttons()

    def new_chat(self) -> None:
        if self.running:
            return
        if self.current is not None and not self.current.messages:
            self.input.setFocus()
            return  # already on an empty chat
        self._save_current()
        self.current = Conversation(system_prompt=self.panel.system_prompt.toPlainText())
        self.conversations.insert(0, self.current)
        self.search.clear()
        self._fill_list()
        self.list.setCurrentRow(0)
        self.render()
        self.input.setFocus()

    def _system_prompt_edited(self, text: str) -> None:
        if self.current is not None and not self.running:
            self.current.system_prompt = text
            self._save_timer.start()

    def _save_current(self) -> None:
        self._save_timer.stop()
        if self.current is not None and self.current.messages and self.current in self.conversations:
            self.store.save(self.current)

    # --- sending ------------------------------------------------------------------------------
    def set_model(self, loaded) -> None:
        self.loaded = loaded
        self.set_ready(True)

    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        self._sync_buttons()

    def _has_reply(self) -> bool:
        return bool(self.current and self.current.messages and self.current.messages[-1]["role"] == "assistant")

    def _sync_buttons(self) -> None:
        self.send_button.setEnabled(self.ready and not self.running)
        self.stop_button.setEnabled(self.running)
        self.regenerate_button.setEnabled(self.ready and not self.running and self._has_reply())
        self.copy_button.setEnabled(self._has_reply())
        for w in (self.new_button, self.delete_button, self.more_button, self.panel):
            w.setEnabled(not self.running)

    def begin_edit(self, index: int) -> None:
        """Load an earlier question into the message box; sending it replaces it and all after it."""
        if self.running or self.current is None or not 0 <= index < len(self.current.messages):
            return
        if self.current.messages[index]["role"] != "user":
            return
        self.editing = index
        self.input.setPlainText(self.current.messages[index]["content"])
        self.input.setFocus()
        self.edit_bar.show_message("Editing an earlier message: sending it replaces it and the replies after it.")

    def cancel_edit(self) -> None:
        if self.editing is not None:
            self.editing = None
            self.input.clear()
        self.edit_bar.dismiss()

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or not self.ready or self.running or self.current is None:
            return
        if self.editing is not None:
            del self.current.messages[self.editing:]  # the later turns answered the old question
            self.editing = None
            self.edit_bar.dismiss()
        self.current.system_prompt = self.panel.system_prompt.toPlainText()
        self.current.messages.append({"role": "user", "content": text})
        if self.current.title == "New chat":
            self.current.title = text.splitlines()[0][:48]
            self._fill_list()
        self.store.save(self.current)  # the user's words are on disk before we generate
        self.input.clear()
        self._start_reply()

    def regenerate(self) -> None:
        if self.running or not self._has_reply():
            return
        self.current.messages.pop()
        self.store.save(self.current)
        self._start_reply()

    def _start_reply(self) -> None:
        self.running = True
        self.streaming = {"role": "assistant", "content": ""}
        self.stats.setText("generating…")
        self.send_requested.emit(self.current.chat_messages(), self.decode_settings(), self.drafter_kind())
        self.render()
        self._sync_buttons()

    def _escape(self) -> None:
        if self.running:
            self.stop_requested.emit()
        else:
            self.cancel_edit()

    def copy_reply(self) -> None:
        if self._has_reply():
            QGuiApplication.clipboard().setText(self.current.messages[-1]["content"])
            self.stats.setText("reply copied")

    def copy_code(self, message: int, block: int) -> None:
        """The Copy link of a code block: exactly that block's code goes to the clipboard."""
        if self.current is None:
            return
        messages = self.current.messages + ([self.streaming] if self.streaming else [])
        if 0 <= message < len(messages):
            blocks = code_blocks(messages[message]["content"])
            if 0 <= block < len(blocks):
                QGuiApplication.clipboard().setText(blocks[block])
                self.stats.setText("code copied")

    # --- engine events ------------------------------------------------------------------------
    def on_lane_event(self, item) -> None:
        event = item.event
        if self.streaming is None:
            return
        if isinstance(event, Tokens):
            self.streaming["content"] += event.text
            if not self._render_timer.isActive():  # a throttle, not a debounce: it fires while tokens flow
                self._render_timer.start()
        elif isinstance(event, Stats):
            self.stats.setText(describe(event.stats))
        elif isinstance(event, Finished):
            note = describe(event.stats) + (" · stopped" if event.reason == "cancelled" else "")
            self.current.messages.append({"role": "assistant", "content": event.text, "stats": note,
                                          "meta": reply_meta(event, self.loaded)})
            self.store.save(self.current)
            self._end(note, self.current.messages[-1])
        elif isinstance(event, Failed):
            self._end("")

    def job_ended(self) -> None:
        """The worker finished the job (also after a failure or cancel before any event)."""
        if self.running:
            self._end(self.stats.text() if self.streaming is None else "")

    def _end(self, note: str, reply: dict | None = None) -> None:
        self._render_timer.stop()
        self.streaming = None
        self.running = False
        self.stats.setText(note)
        # A finished reply completes its streamed rendering in place: laying the whole
        # conversation out again would freeze the window for a long one.
        if reply is None or not self.transcript.finish_stream(reply["content"], note, describe_meta(reply["meta"])):
            self.render()
        self._sync_buttons()

    def _render_stream(self) -> None:
        if self.streaming is not None:
            self.transcript.stream(self.streaming["content"])

    def render(self) -> None:
        if self.current is None:
            self.transcript.clear()
            return
        tips = {i: describe_meta(m["meta"]) for i, m in enumerate(self.current.messages) if m.get("meta")}
        self.transcript.render_turns(self.current.messages, self.streaming["content"] if self.streaming else None, tips)
