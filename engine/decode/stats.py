"""Counting what a run did: tokens, timings, drafted/accepted per position."""
from __future__ import annotations

import time

from engine.core.events import RunStats


def decode_rate(new_tokens: int, first_tokens: int, seconds_after_first: float) -> float:
    """Tokens after the first block (the prefill's) over the seconds after it; 0 before there
    are any."""
    later = new_tokens - first_tokens
    return later / seconds_after_first if later > 0 and seconds_after_first > 0 else 0.0


class StatsTracker:
    def __init__(self, prompt_tokens: int = 0) -> None:
        self.start = time.perf_counter()
        self.prompt_tokens = prompt_tokens
        self.prompt_done = 0  # prompt tokens in the target's cache so far (kept or prefilled)
        self.cached_tokens = 0  # ... of which were kept from an earlier request
        self.first_token_at: float | None = None
        self._first_block = 0
        self.new_tokens = 0
        self.passes = 0
        self.drafted = 0
        self.accepted = 0
        self.drafted_at: list[int] = []  # per draft position: how often it was drafted
        self.accepted_at: list[int] = []  # ... and accepted
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.off_steps = 0
        self.forced_tokens = 0

    def prefilled(self, done: int, cached: int | None = None) -> None:
        self.prompt_done = done
        if cached is not None:
            self.cached_tokens = cached

    def add_tokens(self, n: int) -> None:
        if n and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
            self._first_block = n  # tokens that arrived with the first (prefill's): not decode-rate
        self.new_tokens += n

    def add_pass(self, drafted: int, accepted: int, draft_s: float, verify_s: float, off: bool = False) -> None:
        """One speculative pass; ``off``: it ran plain because speculation did not pay then."""
        self.passes += 1
        self.off_steps += off
        self.drafted += drafted
        self.accepted += accepted
        self.draft_s += draft_s
        self.verify_s += verify_s
        while len(self.drafted_at) < drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted

    def snapshot(self) -> RunStats:
        now = time.perf_counter()
        seconds = now - self.start
        after_first = now - self.first_token_at if self.first_token_at is not None else 0.0
        return RunStats(
            new_tokens=self.new_tokens,
            seconds=seconds,
            tok_per_s=self.new_tokens / seconds if seconds > 0 else 0.0,
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.start,
            decode_tok_per_s=decode_rate(self.new_tokens, self._first_block, after_first),
            target_passes=self.passes,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance=self.accepted / self.drafted if self.drafted else 0.0,
            mean_accepted_per_pass=self.accepted / self.passes if self.passes else 0.0,
            tokens_per_pass=(self.accepted + self.passes) / self.passes if self.passes else 0.0,
            acceptance_by_position=tuple(
                a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)
            ),
            draft_seconds=self.draft_s,
            verify_seconds=self.verify_s,
            speculation_off_steps=self.off_steps,
            prompt_tokens=self.prompt_tokens,
            prompt_done=self.prompt_done,
            cached_tokens=self.cached_tokens,
            forced_tokens=self.forced_tokens,
        )
