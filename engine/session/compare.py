"""Run plain and speculative decoding on the same prompt and compare them honestly."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.events import Failed, Finished, PlainVsSpeculative
from engine.core.settings import DecodeSettings
from engine.decode.divergence import Divergence, explain_divergence
from engine.session.session import DrafterKind, Session


@dataclass(frozen=True)
class Comparison(PlainVsSpeculative):
    prompt_ids: tuple[int, ...]
    plain: Finished
    speculative: Finished
    divergence: Divergence | None
    # The untimed warm-up both lanes ran after before either was timed (see warm_up).
    warm_up_seconds: float | None = None
    # The threads each lane ran with (engine.core.threads), as a report line.
    plain_threads: str = ""
    speculative_threads: str = ""

    @property
    def decode_speedup(self) -> float:
        """The speedup after the first token (without the prefill both lanes pay alike)."""
        p = self.plain.stats.decode_tok_per_s
        return self.speculative.stats.decode_tok_per_s / p if p else 0.0


def drain(events, on_event: Callable | None = None) -> Finished:
    for event in events:
        if on_event:
            on_event(event)
        if isinstance(event, Failed):
            raise RuntimeError(event.error)
        if isinstance(event, Finished):
            return event
    raise RuntimeError("generation ended without a result")


def warm_up(session: Session, drafter: DrafterKind = "model") -> None:
    """Run both paths for a few tokens so one-time costs (first kernel calls, allocations) are
    not billed to whichever run is timed first."""
    ids = session.encode("Say hi.")
    drain(session.plain(ids, DecodeSettings(max_new_tokens=4)))
    drain(session.speculative(ids, DecodeSettings(max_new_tokens=4, draft_length=2), drafter))
    # Its costs are the one-time ones: seeding the first real request with them could start
    # that request with speculation off.
    session.forget_costs()


def compare(session: Session, prompt: str, settings: DecodeSettings, drafter: DrafterKind = "model", on_event: Callable | None = None,
            against: DrafterKind = "off") -> Comparison:
    """``against``: the first lane's drafter ("off": plain decoding; "draft_model": the draft model
    loaded beside a drafter made for the target, raced against it)."""
    start = time.perf_counter()
    warm_up(session, drafter)
    if against != "off":
        warm_up(session, against)
    warmed = time.perf_counter() - start
    prompt_ids = session.encode(prompt)
    # Both runs start as a first turn: neither finds the other's (or the warm-up's) prefix.
    session.forget_prefixes()
    plain = drain(session.speculative(prompt_ids, settings, against), on_event and (lambda e: on_event("plain", e)))
    plain_threads = session.threads.describe_last()
    session.forget_prefixes()
    spec = drain(session.speculative(prompt_ids, settings, drafter), on_event and (lambda e: on_event("speculative", e)))
    divergence = None
    if plain.token_ids != spec.token_ids and settings.mode == "greedy":
        divergence = explain_divergence(session.target.model, prompt_ids, list(plain.token_ids), list(spec.token_ids))
    return Comparison(tuple(prompt_ids), plain, spec, divergence, warmed, plain_threads, session.threads.describe_last())
