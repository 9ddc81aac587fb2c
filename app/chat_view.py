"""Multi-turn chat with the loaded model; speculation on by default; history saved on disk.

The tab holds the conversation list (search, rename, delete with undo, export and import), the
transcript (app/chat_transcript.py: Markdown replies, a copy button per code block), the preset and
settings panel (app/chat_settings.py) and the message box with its attached files.

Files are attached by the Attach button or dropped anywhere on the tab. Each is read, and its
tokens counted with the loaded model's tokenizer, on the engine's worker thread
(app/jobs.py: read_attachment), never on the GUI thread; its chip shows the count. Before a
message is sent, the worker counts the whole request through the chat template
(app/jobs.py: prompt_budget): one that does not fit the context window with the reply's Max
tokens is not sent, and the notice says which file is too large and by how much.
"""
from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSplitter,
    QStyle,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import jobs, json_files
from app.app_settings import AppSettings, Key
from app.chat_library import ConversationActions
from app.chat_settings import CUSTOM, ChatSettingsPanel
from app.chat_tools import ChatToolActions
from app.chat_transcript import Transcript
from app.attachments import Attachment, over_budget
from app.chat_widgets import AttachmentStrip, ChatInput, NoticeBar, local_files
from app.conversations import Conversation, ConversationStore
from app.markdown_view import code_blocks
from app.messages import AttachmentRead, JobEnded, PromptBudget
from app.presets import Preset, PresetStore
from app.reply_stats import describe, describe_meta, reply_meta
from engine.core.events import Failed, Finished, Stats, Tokens

log = logging.getLogger(__name__)
STREAM_RENDER_MS = 80  # at most this often the streaming reply is laid out again


class ChatView(ConversationActions, ChatToolActions, QWidget):
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
        #: The composer's attached files by chip key, in order: None while being read.
        self.attached: dict[int, Attachment | None] = {}
        self._keys = itertools.count(1)
        self._host = None  # app.worker.EngineHost: reads, counts and checks requests off the GUI thread
        self._attach_jobs: dict[int, tuple[int, str | None, Attachment | None]] = {}  # job -> what it reads
        self._send_after_read = False  # Send was pressed while a file was still being read
        self.checking = False  # the request's tokens are being counted before it is sent
        self._budget_job: int | None = None
        self._budget_next = None  # (what sending does once it fits, the new message's attachments)

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

        self.new_button.clicked.connect(self.new_chat)
        self.delete_button.clicked.connect(self.delete_chat)
        self.undo_bar.action.connect(self.undo_delete)
        self.undo_bar.closed.connect(self._forget_deleted)
        self.list.currentRowChanged.connect(self._select)
        self.list.itemChanged.connect(self._renamed)
        self.search.textChanged.connect(self._filter)
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

    # --- the context budget -------------------------------------------------------------------
    def _check_budget(self, messages: list[dict], attachments: list[Attachment], proceed, refuse=lambda: None) -> None:
        """Count ``messages`` on the worker; ``proceed()`` once they fit with room for the reply,
        ``refuse()`` (and a notice saying why) when they do not."""
        host = self._engine()
        if host is None:  # no engine to count with (never in the window): the engine refuses what does not fit
            proceed()
            return
        self.running = self.checking = True
        self.streaming = {"role": "assistant", "content": ""}  # the reply is awaited
        self.stats.setText("checking the context…")
        self._budget_next = (proceed, refuse, attachments)
        self._budget_job = host.submit("budget", jobs.prompt_budget(messages, tuple(attachments)))
        self.render()
        self._sync_buttons()

    def _budget_checked(self, budget: PromptBudget | None) -> None:
        proceed, refuse, attachments = self._budget_next
        self._budget_next = self._budget_job = None
        self.running = self.checking = False
        self.streaming = None
        if budget is None:  # the check was cancelled or failed: nothing is sent
            refuse()
            self.stats.setText("not sent")
            self._sync_buttons()
            return
        names = [a.name for a in attachments]
        problem = budget.error or (over_budget(budget.prompt_tokens, budget.window, self.panel.max_new_tokens.value(),
                                               list(zip(names, budget.attachments)))
                                   if budget.prompt_tokens is not None and budget.window else "")
        if problem:
            refuse()
            self.notice.show_message(problem)
            self.stats.setText("not sent")
            self._sync_buttons()
            return
        proceed()

    def _stop(self) -> None:
        if self.checking:  # stop waiting for the count: nothing was sent
            self._budget_checked(None)
            return
        self.stop_requested.emit()

    # --- attachments --------------------------------------------------------------------------
    def _engine(self):
        """The window's engine host (the worker that reads files and counts tokens)."""
        if self._host is None:
            host = getattr(self.window(), "host", None)
            if host is not None:
                self.use_engine(host)
        return self._host

    def use_engine(self, host) -> None:
        if host is not self._host:
            self._host = host
            host.event.connect(self._engine_event)

    def _ask_attach(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach files", str(Path.home()),
                                                "Text, code and PDF files (*);;PDF (*.pdf)")
        if paths:
            self.attach_files(paths)

    def attach_files(self, paths: list) -> None:
        """Attach each file: a chip at once, its text read and its tokens counted on the worker."""
        for path in paths:
            key = next(self._keys)
            self.attachments.add(key, Path(path).name)
            self.attached[key] = None
            self._read(key, path=str(path))

    def _read(self, key: int, path: str | None = None, attachment: Attachment | None = None) -> None:
        host = self._engine()
        if host is None:
            self._attachment_read(AttachmentRead(key, Path(path or "").name, error="the engine is not running"))
            return
        job = host.submit("attach", jobs.read_attachment(key, path, attachment))
        self._attach_jobs[job] = (key, path, attachment)

    def remove_attachment(self, key: int) -> None:
        self.attached.pop(key, None)
        self.attachments.remove(key)
        if self._send_after_read and not any(a is None for a in self.attached.values()):
            self.send()

    def clear_attachments(self) -> None:
        self.attached.clear()
        self.attachments.clear()
        self._send_after_read = False

    def _engine_event(self, envelope) -> None:
        payload = envelope.payload
        if envelope.job in self._attach_jobs:
            if isinstance(payload, AttachmentRead):
                del self._attach_jobs[envelope.job]
                self._attachment_read(payload)
            elif isinstance(payload, JobEnded):  # ended without a result
                key, path, attachment = self._attach_jobs.pop(envelope.job)
                if payload.cancelled and key in self.attached:  # Stop dropped the queue: read it again
                    self._read(key, path, attachment)
                elif key in self.attached:
                    self._attachment_read(AttachmentRead(key, Path(path or "").name, error="it could not be read (the log says why)"))
        elif envelope.job == self._budget_job and self._budget_job is not None:
            if isinstance(payload, PromptBudget):
                self._budget_checked(payload)
            elif isinstance(payload, JobEnded):
                self._budget_checked(None)

    def _attachment_read(self, read: AttachmentRead) -> None:
        if read.key not in self.attached:
            return  # removed while it was read
        if read.attachment is None:
            self.attached.pop(read.key)
            self.attachments.remove(read.key)
            self.notice.show_message(f"Not attached: {read.error}")
        else:
            self._show_read(read.key, read.attachment)
        if self._send_after_read and not any(a is None for a in self.attached.values()):
            self.send()

    def _show_read(self, key: int, attachment: Attachment) -> None:
        self.attached[key] = attachment
        chip = self.attachments.chips[key]
        if attachment.tokens is not None:
            chip.set_state(f"{attachment.tokens:,} tokens", f"{attachment.name}: {len(attachment.text):,} characters, "
                                                             f"{attachment.tokens:,} tokens with the loaded model's tokenizer")
        else:
            chip.set_state(f"{len(attachment.text):,} characters",
                           f"{attachment.name}: tokens are counted with a local model's tokenizer, once one is loaded")

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if local_files(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.dragEnterEvent(event)

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        paths = local_files(event.mimeData())
        if paths:
            event.acceptProposedAction()
            self.attach_files(paths)
        else:
            event.ignore()

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
            if event.reason == "max_new_tokens" and self.sent_format != "text":
                self.notice.show_message("The reply reached Max tokens before its JSON was complete: raise Max tokens "
                                         "(Settings) and regenerate.")
            if self.tool_turn and event.reason != "cancelled":  # tool calls and another reply may follow
                self._render_timer.stop()
                self.streaming = None
                self.stats.setText(note)
                self.render()
                return
            self._end(note, self.current.messages[-1])
        elif isinstance(event, Failed):
            self._end("")

    def job_ended(self) -> None:
        """The worker finished the job (also after a failure or cancel before any event)."""
        if self.running and not self.checking:
            self._end(self.stats.text() if self.streaming is None else "")

    def _end(self, note: str, reply: dict | None = None) -> None:
        self._answer_pending(False)  # a call still waiting for the person is declined
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
