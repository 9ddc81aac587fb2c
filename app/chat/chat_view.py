"""Multi-turn chat with the loaded model; speculation on by default; history saved on disk.

The tab holds the conversation list (search, rename, delete with undo, export and import), the
transcript (app/chat/chat_transcript.py: Markdown replies, a copy button per code block), the preset and
settings panel (app/chat/chat_settings.py) and the message box with its attached files.

Its parts: the conversation list's actions (app/chat/chat_library.py), attached files and the
context check before sending (app/chat/chat_composer.py), the streaming reply
(app/chat/chat_reply.py) and MCP tool calls (app/chat/chat_tools.py).
"""
from __future__ import annotations

import itertools
import json
import logging

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QStyle,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.chat_composer import ComposerActions
from app.chat.chat_library import ConversationActions
from app.chat.chat_reply import STREAM_RENDER_MS, ReplyStream
from app.chat.chat_settings import CUSTOM, ChatSettingsPanel
from app.chat.chat_tools import ChatToolActions
from app.chat.chat_transcript import Transcript
from app.chat.chat_widgets import AttachmentStrip, ChatInput, NoticeBar
from app.store import json_files
from app.store.app_settings import AppSettings, Key
from app.store.attachments import Attachment
from app.store.conversations import Conversation, ConversationStore
from app.store.presets import Preset, PresetStore
from app.widgets.markdown_view import code_blocks
from app.widgets.reply_stats import describe_meta

log = logging.getLogger(__name__)


class ChatView(ConversationActions, ChatToolActions, ComposerActions, ReplyStream, QWidget):
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
        self.loaded = None  # app.bridge.messages.ModelLoaded: names the model in each reply's stats
        self.editing: int | None = None  # index of the earlier question being edited
        self.deleted: tuple[Conversation, bytes | None, int] | None = None  # what Undo puts back
        #: The composer's attached files by chip key, in order: None while being read.
        self.attached: dict[int, Attachment | None] = {}
        self._keys = itertools.count(1)
        self._host = None  # app.bridge.worker.EngineHost: reads, counts and checks requests off the GUI thread
        self._attach_jobs: dict[int, tuple[int, str | None, Attachment | None]] = {}  # job -> what it reads
        self._send_after_read = False  # Send was pressed while a file was still being read
        self.checking = False  # the request's tokens are being counted before it is sent
        self._budget_job: int | None = None
        self._budget_next = None  # (what sending does once it fits, the new message's attachments)

        left = self._build_library()
        right = QWidget()
        col = QVBoxLayout(right)
        col.setContentsMargins(0, 0, 0, 0)
        self.panel = ChatSettingsPanel(presets)
        self.tools_button = self.panel.tools_button
        self.tool_turn = False  # the reply being generated may call tools (more replies follow it)
        self.sent_format = "text"
        self.transcript = Transcript()
        self.edit_bar = NoticeBar("Cancel")
        self.notice = NoticeBar("", "#fce8e6")  # a file not attached, a request too long to send
        self.notice.text.setWordWrap(True)  # a long reason wraps, never widens the window
        self.attachments = AttachmentStrip()
        self.input = ChatInput()
        self.input.setFixedHeight(80)
        row = QHBoxLayout()
        self.attach_button = QToolButton()
        self.attach_button.setText("Attach…")
        self.attach_button.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_FileIcon))
        self.attach_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.attach_button.setToolTip("Attach text, code or PDF files (or drop them on the chat)")
        row.addWidget(self.attach_button)
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
        for w in (self.panel, self.transcript, self.edit_bar, self.notice, self.attachments, self.input):
            col.addWidget(w, 1 if w is self.transcript else 0)
        col.addLayout(row)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([220, 800])
        outer = QVBoxLayout(self)
        outer.addWidget(split)

        self.send_button.clicked.connect(self.send)
        self.input.submitted.connect(self.send)
        self.stop_button.clicked.connect(self._stop)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button.clicked.connect(self.copy_reply)
        self.attach_button.clicked.connect(self._ask_attach)
        self.tools_button.clicked.connect(self.edit_tools)
        self.attachments.removed.connect(self.remove_attachment)
        self.input.files_dropped.connect(self.attach_files)
        self.setAcceptDrops(True)
        self.transcript.setAcceptDrops(False)  # a file dropped on the transcript is attached (below)
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
        self._load_tools()
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
        for key, attachment in self.attached.items():  # another tokenizer: count them again
            if attachment is not None:
                self._read(key, attachment=attachment)
                self.attachments.chips[key].set_state("counting…")

    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        self._sync_buttons()

    def _has_reply(self) -> bool:
        """The last question was answered (a reply, or a tool turn where Stop ended it)."""
        return bool(self.current and self.current.messages and self.current.messages[-1]["role"] in ("assistant", "tool"))

    def _sync_buttons(self) -> None:
        self.send_button.setEnabled(self.ready and not self.running)
        self.attach_button.setEnabled(not self.checking)
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
        self.clear_attachments()
        for raw in self.current.messages[index].get("attachments") or ():  # the question's files come with it
            key = next(self._keys)
            self.attachments.add(key, raw["name"])
            self._show_read(key, Attachment.from_json(raw))
        self.input.setFocus()
        self.edit_bar.show_message("Editing an earlier message: sending it replaces it and the replies after it.")

    def cancel_edit(self) -> None:
        if self.editing is not None:
            self.editing = None
            self.input.clear()
            self.clear_attachments()
        self.edit_bar.dismiss()

    def _settings_refused(self) -> bool:
        """True (and a notice saying why) when the settings cannot make a request: a JSON schema
        that is not JSON, say."""
        try:
            self.decode_settings()
        except ValueError as exc:
            self.notice.show_message(f"Not sent: {exc}.")
            return True
        return False

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not (text or self.attached) or not self.ready or self.running or self.current is None:
            return
        if self._settings_refused():
            return
        if any(a is None for a in self.attached.values()):
            self._send_after_read = True  # sent once the last file is read
            self.stats.setText("reading the attached files…")
            return
        self._send_after_read = False
        attachments = list(self.attached.values())
        message = {"role": "user", "content": text}
        if attachments:
            message["attachments"] = [a.to_json() for a in attachments]
        # Shown in the conversation at once; kept (saved, then answered) once the worker has
        # counted it into the context window, taken back whole when it does not fit.
        conversation = self.current
        before = (list(conversation.messages), conversation.title, conversation.system_prompt, self.editing)
        if self.editing is not None:
            del conversation.messages[self.editing:]  # the later turns answered the old question
            self.editing = None
            self.edit_bar.dismiss()
        conversation.system_prompt = self.panel.system_prompt.toPlainText()
        conversation.messages.append(message)
        if conversation.title == "New chat":
            first = text.splitlines()[0] if text else attachments[0].name
            conversation.title = first[:48]
            self._fill_list()
        self.input.clear()
        self.clear_attachments()
        self.notice.dismiss()

        def proceed() -> None:
            self.store.save(conversation)  # the user's words are on disk before we generate
            self._start_reply()

        def refuse() -> None:  # as it was before Send: the message back in the box, with its files
            conversation.messages[:], conversation.title, conversation.system_prompt, self.editing = before
            self._fill_list()
            if self.editing is not None:
                self.edit_bar.show_message("Editing an earlier message: sending it replaces it and the replies after it.")
            if not self.input.toPlainText():
                self.input.setPlainText(text)
            for attachment in attachments:
                key = next(self._keys)
                self.attachments.add(key, attachment.name)
                self._show_read(key, attachment)
            self.render()

        self._check_budget(conversation.chat_messages(), attachments, proceed, refuse)

    def _last_question(self) -> int:
        """Index of the last user turn (the replies and tool turns after it answer it)."""
        return max((i for i, m in enumerate(self.current.messages) if m["role"] == "user"), default=-1)

    def regenerate(self) -> None:
        """Answer the last question again: its reply, and any tool calls and results it made, go."""
        if self.running or not self._has_reply() or self._settings_refused():
            return
        asked = self.current.messages[:self._last_question() + 1]
        files = [Attachment.from_json(a) for a in (asked[-1].get("attachments") or ())] if asked else []
        request = Conversation(system_prompt=self.current.system_prompt, messages=asked)
        self._check_budget(request.chat_messages(), files, self._commit_regenerate)

    def _commit_regenerate(self) -> None:
        if not self._has_reply():
            return
        del self.current.messages[self._last_question() + 1:]
        self.store.save(self.current)
        self._start_reply()

    def _stop(self) -> None:
        if self.checking:  # stop waiting for the count: nothing was sent
            self._budget_checked(None)
            return
        self.stop_requested.emit()

    def _start_reply(self) -> None:
        self.running = True
        self.tool_turn = self.tools_on()
        self.sent_format = self.panel.reply_format.currentData()  # what this reply is held to
        self.streaming = {"role": "assistant", "content": ""}
        self.stats.setText("generating…")
        self.send_requested.emit(self.current.chat_messages(), self.decode_settings(), self.drafter_kind())

        self.render()
        self._sync_buttons()

    def _escape(self) -> None:
        if self.running:
            self._stop()
        else:
            self.cancel_edit()

    def copy_reply(self) -> None:
        replies = [m for m in self.current.messages if m["role"] == "assistant"] if self.current else []
        if self._has_reply() and replies:
            QGuiApplication.clipboard().setText(replies[-1]["content"])
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

    def render(self) -> None:
        if self.current is None:
            self.transcript.clear()
            return
        tips = {i: describe_meta(m["meta"]) for i, m in enumerate(self.current.messages) if m.get("meta")}
        self.transcript.render_turns(self.current.messages, self.streaming["content"] if self.streaming else None, tips)
