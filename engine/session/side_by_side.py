"""The same prompt with and without speculation, interleaved fairly on one device; or with two
drafters, to race a drafter trained here against the draft model (``against``).

Running the two requests one after the other would make the second wait; running them on two
threads would let them fight over the same cores unevenly. Instead both run in one thread and
we always advance the run that has used less compute so far. Each run's clock only ticks while
its own step executes, so its tokens/sec is its solo rate, and both panes of a live view move at
their true relative speeds.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.events import Event, Failed, Finished, PlainVsSpeculative, RunStats, Stats, Tokens
from engine.core.settings import DecodeSettings
from engine.decode.stats import decode_rate
from engine.decode.token_origin import OriginTracker, Segment

if TYPE_CHECKING:  # torch-free at import: the app's GUI thread reads these event types
    from engine.decode.divergence import Divergence
    from engine.session.session import DrafterKind, Session

# The two lanes: the baseline (plain decoding, or the drafter raced against) and the speculative
# run measured against it.
PLAIN, SPECULATIVE = "plain", "speculative"


@dataclass(frozen=True)
class LaneEvent:
    """An engine event from one lane. ``segments`` split a Tokens event's text by origin
    (drafter vs target); stats are restated on the lane's own compute clock."""

    lane: str
    event: Event
    segments: tuple[Segment, ...] = ()


@dataclass(frozen=True)
class SideBySideResult(PlainVsSpeculative):
    plain: Finished
    speculative: Finished
    divergence: Divergence | None
    divergence_chars: tuple[int, int] | None  # where the first differing token starts in each text


class _Lane:
    def __init__(self, name: str, events: Iterator[Event], tokenizer, clock: Callable[[], float]) -> None:
        self.name = name
        self.events = events
        self.origins = OriginTracker(tokenizer)
        self.clock = clock
        self.used = 0.0  # seconds of compute spent inside this lane's steps
        self.ttft: float | None = None
        self.first_tokens = 0  # how many arrived with the first (the prefill's block)
        self.finished: Finished | None = None

    def step(self) -> LaneEvent:
        start = self.clock()
        event = next(self.events)
        self.used += self.clock() - start
        segments: tuple[Segment, ...] = ()
        if isinstance(event, Tokens):
            if event.token_ids and self.ttft is None:
                self.ttft, self.first_tokens = self.used, len(event.token_ids)
            segments = self.origins.feed(event.token_ids, event.from_draft, event.text)
        elif isinstance(event, Stats):
            event = Stats(self._restate(event.stats))
        elif isinstance(event, Finished):
            event = dataclasses.replace(event, stats=self._restate(event.stats))
            self.finished = event
        return LaneEvent(self.name, event, segments)

    def _restate(self, stats: RunStats) -> RunStats:
        seconds = self.used
        return dataclasses.replace(
            stats,
            seconds=seconds,
            tok_per_s=stats.new_tokens / seconds if seconds > 0 else 0.0,
            ttft_s=self.ttft,
            decode_tok_per_s=decode_rate(stats.new_tokens, self.first_tokens, seconds - self.ttft) if self.ttft is not None else 0.0,
        )


def side_by_side(
    session: Session,
    prompt: str | list[dict],
    settings: DecodeSettings,
    drafter: DrafterKind = "model",
    cancel: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.perf_counter,
    against: DrafterKind = "off",
) -> Iterator[LaneEvent | SideBySideResult]:
    """Yield both lanes' events, always stepping the lane that is behind, then the comparison.

    ``against``: the baseline lane's drafter ("off": plain decoding; "draft_model": the separate
    draft model, raced against ``drafter``). Both lanes decode the same target, so their outputs
    are the same tokens whichever drafts (greedy). A ``Failed`` event from either lane ends the
    run (it is yielded first so it can be shown)."""
    try:
        prompt_ids = session.encode(prompt)
    except ValueError as exc:
        yield LaneEvent(PLAIN, Failed(str(exc)))
        return
    lanes = [
        _Lane(PLAIN, session.plain(prompt_ids, settings, cancel) if against == "off" else
              session.speculative(prompt_ids, settings, against, cancel), session.tokenizer, clock),
        _Lane(SPECULATIVE, session.speculative(prompt_ids, settings, drafter, cancel), session.tokenizer, clock),
    ]
    running = list(lanes)
    while running:
        lane = min(running, key=lambda candidate: candidate.used)
        try:
            out = lane.step()
        except StopIteration:
            running.remove(lane)
            continue
        yield out
        if isinstance(out.event, Failed):
            return
        if isinstance(out.event, Finished):
            running.remove(lane)
    plain, spec = lanes[0].finished, lanes[1].finished
    if plain is None or spec is None:
        yield LaneEvent(PLAIN, Failed("generation ended without a result"))
        return
    from engine.decode.divergence import explain_divergence

    divergence = chars = None
    cancelled = "cancelled" in (plain.reason, spec.reason)
    if plain.token_ids != spec.token_ids and settings.mode == "greedy" and not cancelled:
        divergence = explain_divergence(session.target.model, prompt_ids, list(plain.token_ids), list(spec.token_ids))
        if divergence is not None:
            chars = (lanes[0].origins.char_offset(divergence.position), lanes[1].origins.char_offset(divergence.position))
    yield SideBySideResult(plain, spec, divergence, chars)
