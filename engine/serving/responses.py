"""OpenAI response and stream-chunk bodies, with ``usage`` and llama.cpp-style ``timings``.

``timings`` uses llama-server's field names so tools that read them work unchanged:
prompt_n / prompt_ms (prompt tokens, and the time to the first new token: the prefill),
predicted_n / predicted_ms (new tokens, and the time after the first), predicted_per_second
(new tokens after the first over that time, llama.cpp's eval rate), draft_n / draft_n_accepted
(tokens the drafter proposed / the target accepted). Tandem adds mean_accepted_length (tokens
per target pass including the target's own, vLLM's "mean acceptance length"), acceptance_rate,
acceptance_by_position, queue_ms and the drafter used.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from engine.core.events import Finished
from engine.tools.calls import ToolCall, parse

# The engine's finish reasons in OpenAI's words.
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length", "cancelled": "cancelled"}


def usage(prompt_tokens: int, finished: Finished) -> dict:
    """OpenAI's usage; ``cached_tokens``: the prompt's prefix kept from an earlier request."""
    completion = len(finished.token_ids)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": finished.stats.cached_tokens}}


def timings(finished: Finished, prompt_tokens: int, drafter: str, queue_s: float) -> dict:
    s = finished.stats
    prompt_ms = (s.ttft_s or 0.0) * 1000
    predicted_ms = max(0.0, s.seconds * 1000 - prompt_ms)
    # As llama-server counts them: prompt_n the tokens evaluated, cache_n those kept from before.
    evaluated = max(0, prompt_tokens - s.cached_tokens)
    return {
        "cache_n": s.cached_tokens,
        "prompt_n": evaluated,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_second": round(evaluated / prompt_ms * 1000, 3) if prompt_ms else 0.0,
        "predicted_n": s.new_tokens,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / (s.new_tokens - 1), 3) if s.new_tokens > 1 else 0.0,
        "predicted_per_second": round(s.decode_tok_per_s, 3),
        "draft_n": s.drafted,
        "draft_n_accepted": s.accepted,
        "mean_accepted_length": round(s.tokens_per_pass, 4),
        "acceptance_rate": round(s.acceptance, 4),
        "acceptance_by_position": [round(a, 4) for a in s.acceptance_by_position],
        "drafter": drafter,
        "queue_ms": round(queue_s * 1000, 3),
    }


@dataclass
class ReplyShape:
    """What every body of one reply shares: chat ("chat.completion") or text ("text_completion")."""

    chat: bool
    model: str
    id: str = field(default="")
    tools: frozenset[str] = frozenset()  # the offered tools' names: the reply may call them
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _choice(self, text: str | None, finish_reason: str | None, stream: bool) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        if stream:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish_reason}

    def full(self, finished: Finished, prompt_tokens: int, timings_: dict) -> dict:
        body = self._head("chat.completion" if self.chat else "text_completion")
        reason = FINISH_REASONS.get(finished.reason, "stop")
        if self.tools:
            content, calls = parse(finished.text, self.tools)
            choice = self._choice(content, "tool_calls" if calls else reason, stream=False)
            if calls:
                choice["message"]["tool_calls"] = [c.to_openai() for c in calls]
            body["choices"] = [choice]
        else:
            body["choices"] = [self._choice(finished.text, reason, stream=False)]
        body["usage"] = usage(prompt_tokens, finished)
        body["timings"] = timings_
        return body

    def _chunk_head(self) -> dict:
        return self._head("chat.completion.chunk" if self.chat else "text_completion")

    def role_chunk(self) -> dict:
        """A chat stream opens with the assistant's role (OpenAI sends it with empty content)."""
        body = self._chunk_head()
        body["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}]
        return body

    def text_chunk(self, text: str) -> dict:
        body = self._chunk_head()
        body["choices"] = [self._choice(text, None, stream=True)]
        return body

    def tool_calls_chunk(self, calls: tuple[ToolCall, ...]) -> dict:
        """A reply's calls, each whole in one delta (clients join argument pieces; one piece is
        a valid stream)."""
        body = self._chunk_head()
        body["choices"] = [{"index": 0, "delta": {"tool_calls": [c.to_openai(i) for i, c in enumerate(calls)]},
                            "logprobs": None, "finish_reason": None}]
        return body

    def finish_chunk(self, finished: Finished, timings_: dict, called: bool = False) -> dict:
        """The choice's last chunk: its finish reason, and (as llama-server does) the timings."""
        body = self._chunk_head()
        reason = "tool_calls" if called else FINISH_REASONS.get(finished.reason, "stop")
        body["choices"] = [self._choice(None if self.chat else "", reason, stream=True)]
        body["timings"] = timings_
        return body

    def usage_chunk(self, finished: Finished, prompt_tokens: int, timings_: dict) -> dict:
        """Sent after the last choice chunk when ``stream_options.include_usage`` is set."""
        body = self._chunk_head()
        body["choices"] = []
        body["usage"] = usage(prompt_tokens, finished)
        body["timings"] = timings_
        return body
