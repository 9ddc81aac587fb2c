"""One measured request against a remote engine, and two engines raced on the same prompt.

Speed comes from the client's own stream: tokens after the first over the time from the first
chunk to the last (the server's ``completion_tokens`` when it sends usage, else chunks). The
acceptance comes from what the server reports, in this order: the request's own
``timings.draft_n`` / ``draft_n_accepted`` (llama.cpp's server, ``tandem serve``); else the growth
of its Prometheus spec-decode counters around the request (vLLM; exact when nothing else ran on
the server meanwhile); else it is "not reported".
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from engine.remote.client import Chunk, RemoteClient, RemoteError, StreamEnd
from engine.remote.metrics import SpecCounters, spec_counters, spec_delta

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Acceptance:
    source: str  # "timings", "metrics" or "not reported"
    drafted: int = 0
    accepted: int = 0
    drafts: int = 0  # target passes that verified a draft, when known (metrics)

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def reported(self) -> bool:
        return self.source != "not reported"

    def describe(self) -> str:
        if not self.reported:
            return "acceptance not reported"
        if not self.drafted:
            return f"no drafts ({self.source})"
        return f"accepted {self.accepted}/{self.drafted} drafted ({self.rate:.0%}, from {self.source})"


@dataclass(frozen=True)
class RemoteRun:
    name: str
    text: str
    new_tokens: int
    tok_per_s: float  # after the first token
    first_token_s: float | None
    seconds: float
    finish_reason: str | None
    acceptance: Acceptance
    error: str | None = None


def _scrape(client: RemoteClient) -> SpecCounters | None:
    try:
        text = client.metrics_text()
    except RemoteError as exc:  # over its limit, or too slow: the acceptance is then not reported
        log.warning("%s; the acceptance will not come from its /metrics", exc)
        return None
    if text is None:
        return None
    try:
        return spec_counters(text)
    except Exception:  # not Prometheus text (a proxy's page, say), or text the parser trips on
        return None


def reported_count(value) -> int | None:
    """A token count a server reported, None when it is not a finite number >= 0 ("many", NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e15:
        return None
    return int(value)


def stream_rate(end: StreamEnd) -> tuple[int, float]:
    """(new tokens, tokens per second after the first) from the stream itself."""
    n = reported_count(end.usage.get("completion_tokens")) or end.chunks
    if end.first_chunk_at is None or end.last_chunk_at is None or n < 2 or end.last_chunk_at <= end.first_chunk_at:
        return n, 0.0
    return n, (n - 1) / (end.last_chunk_at - end.first_chunk_at)


def acceptance_of(end: StreamEnd, before: SpecCounters | None, after: SpecCounters | None) -> Acceptance:
    timings = end.timings or {}
    drafted, accepted = reported_count(timings.get("draft_n")), reported_count(timings.get("draft_n_accepted"))
    if drafted is not None and accepted is not None:
        return Acceptance("timings", drafted, accepted)
    if before is not None and after is not None:
        delta = spec_delta(before, after)
        if delta is not None:
            return Acceptance("metrics", delta.draft_tokens, delta.accepted, delta.drafts)
    return Acceptance("not reported")


def measured_stream(client: RemoteClient, name: str, model: str, messages: list[dict], **fields
                    ) -> Iterator[Chunk | RemoteRun]:
    """The chunks of one chat request as they arrive, then its RemoteRun."""
    before = _scrape(client)
    start = time.perf_counter()
    end = None
    try:
        for item in client.stream_chat(model, messages, **fields):
            if isinstance(item, StreamEnd):
                end = item
            else:
                yield item
    except RemoteError as exc:
        yield RemoteRun(name, "", 0, 0.0, None, time.perf_counter() - start, None, Acceptance("not reported"), str(exc))
        return
    # The counters are read once the stream ended: a server updates them when a step is done,
    # so the last step has been counted by the time its tokens were sent.
    after = _scrape(client) if before is not None and not (end.timings or {}).get("draft_n") else None
    n, rate = stream_rate(end)
    first = end.first_chunk_at - end.started if end.first_chunk_at is not None else None
    yield RemoteRun(name, end.text, n, rate, first, time.perf_counter() - start, end.finish_reason,
                    acceptance_of(end, before, after))


@dataclass(frozen=True)
class Lane:
    name: str
    client: RemoteClient
    model: str
    extra: tuple[tuple[str, object], ...] = ()  # body fields for this endpoint only (tandem's "speculative")


@dataclass(frozen=True)
class LaneChunk:
    lane: int
    chunk: Chunk
    tok_per_s: float  # live: chunks so far over the time since the first


@dataclass(frozen=True)
class LaneDone:
    lane: int
    run: RemoteRun


@dataclass(frozen=True)
class RaceResult:
    runs: tuple[RemoteRun, ...]

    @property
    def identical(self) -> bool:
        """Under greedy decoding, lossless speculation gives the same text on both sides."""
        return len({r.text for r in self.runs}) == 1 and all(r.error is None for r in self.runs)

    @property
    def speedup(self) -> float | None:
        if len(self.runs) != 2 or not self.runs[1].tok_per_s:
            return None
        return self.runs[0].tok_per_s / self.runs[1].tok_per_s


def race(lanes: Sequence[Lane], messages: list[dict], cancelled=lambda: False, **fields
         ) -> Iterator[LaneChunk | LaneDone | RaceResult]:
    """Every lane's request at once, each on its own thread; their events interleaved as they
    arrive, then the RaceResult. Greedy (temperature 0) unless ``fields`` say otherwise.
    Two endpoints on one machine share its cores: race them on separate machines for speed."""
    fields.setdefault("temperature", 0)
    events: queue.Queue = queue.Queue()

    def run_lane(index: int, lane: Lane) -> None:
        first = None
        count = 0
        try:
            for item in measured_stream(lane.client, lane.name, lane.model, messages, **fields, **dict(lane.extra)):
                if isinstance(item, RemoteRun):
                    events.put(LaneDone(index, item))
                    return
                first = first if first is not None else item.at
                count += 1
                elapsed = item.at - first
                events.put(LaneChunk(index, item, (count - 1) / elapsed if elapsed > 0 else 0.0))
                if cancelled():
                    break
            events.put(LaneDone(index, RemoteRun(lane.name, "", count, 0.0, None, 0.0, "cancelled",
                                                 Acceptance("not reported"), "cancelled")))
        except Exception as exc:  # a lane's failure is its result, never the other lane's
            events.put(LaneDone(index, RemoteRun(lane.name, "", 0, 0.0, None, 0.0, None, Acceptance("not reported"),
                                                 f"{type(exc).__name__}: {exc}")))

    threads = [threading.Thread(target=run_lane, args=(i, lane), daemon=True, name=f"race-{i}")
               for i, lane in enumerate(lanes)]
    for thread in threads:
        thread.start()
    runs: dict[int, RemoteRun] = {}
    while len(runs) < len(lanes):
        event = events.get()
        if isinstance(event, LaneDone):
            runs[event.lane] = event.run
        yield event
    yield RaceResult(tuple(runs[i] for i in range(len(lanes))))
