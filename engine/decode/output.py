"""The generated sequence as a user sees it: stop conditions and streamed text.

Tokens arrive in blocks (a speculative step can yield several). ``OutputBuilder.extend`` takes a
block and keeps only what plain decoding would have produced: it stops at EOS (not shown), at
``max_new_tokens`` (never overrun), or right after a stop string (the text is cut before it).
Text deltas are released only when they are stable: no dangling partial UTF-8 character and no
tail that could still become a stop string.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Extension:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None


class OutputBuilder:
    def __init__(self, tokenizer, eos_ids: set[int], max_new_tokens: int, stop_strings=()) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_new_tokens = max_new_tokens
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.token_ids: list[int] = []
        self.text = ""  # full visible text so far (stop string excluded)
        self._released = 0  # characters of self.text already handed out
        self.finish_reason: str | None = None

    def extend(self, block: list[int]) -> Extension:
        """Append tokens from ``block`` until a stop condition; return what was kept."""
        kept: list[int] = []
        for token in block:
            if self.finish_reason:
                break
            if token in self.eos_ids:
                self.finish_reason = "eos"
                break
            kept.append(token)
            self.token_ids.append(token)
            if self._hit_stop_string():
                self.finish_reason = "stop_string"
            elif len(self.token_ids) >= self.max_new_tokens:
                self.finish_reason = "max_new_tokens"
        if not self.stop_strings:  # with stop strings, _hit_stop_string keeps self.text
            self.text = self._decode()
        return Extension(tuple(kept), self._release(), self.finish_reason)

    def _decode(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    def _hit_stop_string(self) -> bool:
        if not self.stop_strings:
            return False
        text = self._decode()
        # Only look where the newest token could have completed a stop string.
        start = max(0, len(self.text) - max(map(len, self.stop_strings)))
        hits = [i for s in self.stop_strings if (i := text.find(s, start)) >= 0]
        if hits:
            self.text = text[: min(hits)]
            return True
        self.text = text
        return False

    def _release(self) -> str:
        stable = len(self.text)
        if not self.finish_reason:
            if self.text.endswith("\ufffd"):  # a multi-byte character split across tokens
                stable = len(self.text.rstrip("\ufffd"))
            for s in self.stop_strings:  # hold back a tail that may grow into a stop string
                for n in range(min(len(s) - 1, stable), 0, -1):
                    if self.text[stable - n : stable] == s[:n]:
                        stable -= n
                        break
        stable = max(stable, self._released)
        delta = self.text[self._released : stable]
        self._released = stable
        return delta
