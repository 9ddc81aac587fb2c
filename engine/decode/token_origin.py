"""Which characters of a streamed reply came from the drafter and which from the target.

The engine streams text in stable deltas (see engine.decode.output) while token origins are per token.
``OriginTracker`` maps each released character back to the token that produced it, so a view can
colour accepted draft tokens differently from the target's own. Character spans come from
decoding growing prefixes: a multi-byte character split across tokens is credited to the token
that completes it.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    text: str
    from_draft: bool


class OriginTracker:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.from_draft: list[bool] = []
        self.ends: list[int] = []  # ends[i]: characters of decoded text after token i
        self.released = 0

    def feed(self, token_ids, from_draft, text: str) -> tuple[Segment, ...]:
        """Record a step's tokens and split its released ``text`` into runs by origin."""
        for token, drafted in zip(token_ids, from_draft):
            self.token_ids.append(token)
            self.from_draft.append(bool(drafted))
            decoded = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
            # A dangling partial character decodes as U+FFFD; it belongs to a later token.
            self.ends.append(len(decoded.rstrip("\ufffd")))
        segments: list[Segment] = []
        for offset, char in enumerate(text):
            origin = self._origin_at(self.released + offset)
            if segments and segments[-1].from_draft == origin:
                segments[-1] = Segment(segments[-1].text + char, origin)
            else:
                segments.append(Segment(char, origin))
        self.released += len(text)
        return tuple(segments)

    def _origin_at(self, position: int) -> bool:
        if not self.token_ids:
            return False
        index = min(bisect_right(self.ends, position), len(self.token_ids) - 1)
        return self.from_draft[index]

    def char_offset(self, token_index: int) -> int:
        """Characters of text before token ``token_index`` (where a marker for it would go)."""
        if token_index <= 0:
            return 0
        return self.ends[min(token_index, len(self.ends)) - 1]
