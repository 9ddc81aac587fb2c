"""A reply as it streams in: the engine's lane events become the growing transcript entry (laid
out at most every STREAM_RENDER_MS), its stats line, and the finished message saved with the
conversation. A mixin of app.chat.chat_view.ChatView.
"""
from __future__ import annotations

from app.widgets.reply_stats import describe, describe_meta, reply_meta
from engine.core.events import Failed, Finished, Stats, Tokens

STREAM_RENDER_MS = 80  # at most this often the streaming reply is laid out again


class ReplyStream:
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
