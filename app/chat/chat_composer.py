"""The chat's composer: files attached (the Attach button, or dropped anywhere on the tab), each
read and its tokens counted on the engine's worker (app.bridge.jobs.read_attachment), never on
the GUI thread; and the context check before a message is sent (app.bridge.jobs.prompt_budget):
a request that does not fit the window with the reply's Max tokens is not sent, and the notice
says which file is too large and by how much. A mixin of app.chat.chat_view.ChatView.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from app.bridge import jobs
from app.bridge.messages import AttachmentRead, JobEnded, PromptBudget
from app.chat.chat_widgets import local_files
from app.store.attachments import Attachment, over_budget


class ComposerActions:
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
