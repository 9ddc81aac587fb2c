"""The chat's side of tool calls (a mixin of app.chat.chat_view.ChatView).

A turn with MCP tools runs on the worker (app/bridge/tool_jobs.py) as a few replies in a row: a reply
that calls tools, then each call's result, then the reply after them. The conversation keeps
them all, as the model wrote and read them: the calling reply with its ``tool_calls`` (the raw
call text is not shown), a ``tool`` turn per result. Each call is confirmed by the person first,
in a dialog that names the tool, its server and its arguments; Stop, or closing the dialog,
declines it. The model is told a declined call was declined.
"""
from __future__ import annotations

import logging

from PySide6.QtWidgets import QMessageBox

from app.bridge.messages import ToolConfirm, ToolNotice
from app.chat.chat_transcript import pretty_arguments
from app.chat.tools_dialog import ToolsDialog
from app.store.tool_settings import ToolSettings, load_tool_settings, save_tool_settings
from engine.session.chat import DECLINED, ReplyCalledTools, ToolCallAnswered
from engine.tools.mcp import ToolResult

log = logging.getLogger(__name__)


def _arguments_preview(arguments: str, limit: int = 600) -> str:
    text = pretty_arguments(arguments)
    return text if len(text) <= limit else text[:limit] + "…"


class ChatToolActions:
    """Needs from the view: current, store, streaming, notice, render(), _render_timer,
    tools_button, settings."""

    tools: ToolSettings
    confirm_box: QMessageBox | None = None
    _pending: ToolConfirm | None = None

    def _load_tools(self) -> None:
        self.tools = load_tool_settings(self.settings)
        self._show_tools_count()

    def _show_tools_count(self) -> None:
        on = [s.name for s in self.tools.servers if s.enabled]
        self.tools_button.setText(f"Tools ({len(on)})" if on else "Tools…")
        self.tools_button.setToolTip("MCP servers whose tools the model may call: " + (", ".join(on) if on else "none"))

    def tools_on(self) -> bool:
        return any(s.enabled for s in self.tools.servers)

    def edit_tools(self) -> ToolsDialog:
        """Open the Tools dialog (not modal: the chat stays usable); saved when accepted."""
        dialog = ToolsDialog(self.tools, self)
        dialog.accepted.connect(lambda: self._tools_saved(dialog.result_settings))
        dialog.open()
        return dialog

    def _tools_saved(self, tools: ToolSettings | None) -> None:
        if tools is None:
            return
        self.tools = tools
        save_tool_settings(self.settings, tools)
        self._show_tools_count()

    # --- the turn's tool events (from the worker) ----------------------------------------------
    def on_tool_event(self, payload) -> None:
        if isinstance(payload, ToolNotice):
            self.notice.show_message(payload.text)
        elif isinstance(payload, ReplyCalledTools):
            self._reply_called(payload)
        elif isinstance(payload, ToolConfirm):
            self._confirm(payload)
        elif isinstance(payload, ToolCallAnswered):
            self._answered(payload)

    def _reply_called(self, event: ReplyCalledTools) -> None:
        """The reply kept by its Finished is the raw call text: keep what it says and its calls."""
        if self.current is None or not self.current.messages or self.current.messages[-1]["role"] != "assistant":
            return
        reply = self.current.messages[-1]
        reply["content"] = event.content or ""
        reply["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in event.calls]
        self.store.save(self.current)
        self.render()

    def _confirm(self, request: ToolConfirm) -> None:
        self._answer_pending(False)  # one question at a time
        self._pending = request
        where = f" from the MCP server “{request.server}”" if request.server else ""
        box = QMessageBox(QMessageBox.Icon.Question, "Run a tool?",
                          f"The model wants to run the tool “{request.name}”{where} with:\n\n"
                          f"{_arguments_preview(request.arguments)}", parent=self)
        box.setInformativeText("Run it with these arguments?")
        box.setDetailedText(_arguments_preview(request.arguments, 20_000))
        self.run_tool_button = box.addButton("Run", QMessageBox.ButtonRole.AcceptRole)
        self.decline_tool_button = box.addButton("Decline", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(self.run_tool_button)
        box.finished.connect(lambda _code: self._answer_pending(box.clickedButton() is self.run_tool_button))
        self.confirm_box = box
        self.stats.setText(f"waiting for you to allow {request.name}…")
        box.open()

    def _answer_pending(self, run: bool) -> None:
        request, self._pending = self._pending, None
        if request is not None:
            request.answer.put(run)
            self.stats.setText(f"running {request.name}…" if run else f"{request.name} declined")
        box, self.confirm_box = self.confirm_box, None
        if box is not None and box.isVisible():
            box.done(0)

    def _answered(self, event: ToolCallAnswered) -> None:
        if self.current is None:
            return
        result: ToolResult | None = event.result
        outcome = "declined" if result is None else ("failed" if result.is_error else "ran")
        self.current.messages.append({"role": "tool", "name": event.call.name, "outcome": outcome,
                                      "content": DECLINED if result is None else result.text})
        self.store.save(self.current)
        self.streaming = {"role": "assistant", "content": ""}  # the reply after the result
        self.stats.setText("generating…")
        self.render()
