"""The engine thread behind the server: one loaded Session, one thread, requests in arrival order.

The HTTP side (asyncio) submits a ``GenerationRequest`` and gets a ``Job``: a bounded FIFO queue
holds it until the thread is free; a full queue refuses at once (``QueueFull``, answered 429).
The thread drains the Session's event generator and hands each ``Tokens`` / ``Finished`` /
``Failed`` event to the job's asyncio queue through ``loop.call_soon_threadsafe``. ``Job.cancel``
sets a flag the engine reads between decode steps (its ``cancel`` hook), so a client that goes
away frees the engine after at most one more step; a job cancelled while still queued is
skipped. Counters (served, in flight, queue depth, drafted / accepted, per position) are kept
here, under one lock, for /metrics and for the app.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from engine.core.events import Failed, Finished, RunStats, Tokens
from engine.core.settings import DecodeSettings
from engine.session.session import DrafterKind, Session

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The request queue is at capacity; ``retry_after_s`` estimates when a place frees up."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the server is busy: retry in about {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class GenerationRequest:
    """One request for the engine. ``drafter`` "off" decodes without speculation."""

    prompt_ids: tuple[int, ...]
    settings: DecodeSettings
    drafter: DrafterKind
    request_id: str
    prompt_text: str = ""  # for the log, and only when the server logs prompts


@dataclass(frozen=True)
class Counters:
    """The server's totals since it started. ``in_flight`` = running + queued."""

    requests_served: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    requests_rejected: int = 0
    in_flight: int = 0
    running: int = 0
    queue_depth: int = 0
    queue_capacity: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_drafts: int = 0  # target passes that verified a draft (vLLM's num_drafts)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()
    busy_seconds: float = 0.0
    last_tok_per_s: float = 0.0  # the last finished request's rate after its first token


@dataclass
class _Totals:
    served: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0
    in_flight: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    per_position: list[int] = field(default_factory=list)
    busy_seconds: float = 0.0
    last_tok_per_s: float = 0.0
    mean_request_s: float = 1.0  # smoothed, for Retry-After


class Job:
    """A submitted request as the HTTP side sees it: its events, and a way to cancel it."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.submitted_at = time.perf_counter()
        self.started_at: float | None = None
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def queue_seconds(self) -> float:
        return (self.started_at or time.perf_counter()) - self.submitted_at

    def push(self, event) -> None:
        """From the engine thread. A closed loop (server gone) cancels the job."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:
            self.cancel()

    async def events(self):
        """Tokens events, then one Finished or Failed."""
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, (Finished, Failed)):
                return

    async def result(self) -> Finished | Failed:
        async for event in self.events():
            if isinstance(event, (Finished, Failed)):
                return event
        raise RuntimeError("unreachable")  # pragma: no cover


class ServingWorker:
    """Owns the Session while the server runs: nothing else may decode on it meanwhile."""

    def __init__(self, session: Session, queue_size: int = 16, log_prompts: bool = False) -> None:
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        self.session = session
        self.queue_size = queue_size
        self.log_prompts = log_prompts
        self.model_id = session.target.name
        config = session.target.model.config
        self.context_window: int | None = getattr(config.get_text_config(), "max_position_embeddings", None)
        # Requests are tokenized on the HTTP side while the engine thread decodes with the
        # session's tokenizer: a copy keeps the two from sharing one Rust tokenizer object.
        try:
            self._tokenizer = copy.deepcopy(session.tokenizer)
        except Exception:  # pragma: no cover - a tokenizer that cannot be copied is used under the lock
            self._tokenizer = session.tokenizer
        self._tokenizer_lock = threading.Lock()
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._totals = _Totals()
        self._running: Job | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "ServingWorker":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tandem-serving", daemon=True)
            self._thread.start()
        return self

    def cancel_all(self) -> None:
        """Cancel the running request and every queued one (they finish as 'cancelled')."""
        with self._lock:
            running = self._running
        if running is not None:
            running.cancel()
        for job in list(self._queue.queue):
            if job is not None:
                job.cancel()

    def stop(self, timeout: float = 30.0) -> None:
        self.cancel_all()
        if self._thread is not None:
            self._queue.put(None)  # blocks only while the queue is full of cancelled jobs
            self._thread.join(timeout)
            self._thread = None

    # -- the HTTP side ---------------------------------------------------------------------
    def has_draft_model(self) -> bool:
        return self.session.model_drafter is not None

    @property
    def chat_template(self) -> str | None:
        template = getattr(self._tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        tok = self._tokenizer
        with self._tokenizer_lock:
            if getattr(tok, "chat_template", None):
                encoded = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)
                return list(encoded["input_ids"])
            return list(tok("\n".join(m["content"] for m in messages))["input_ids"])

    def encode_text(self, text: str) -> list[int]:
        with self._tokenizer_lock:
            return list(self._tokenizer(text)["input_ids"])

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Job:
        job = Job(request, loop)
        with self._lock:
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                self._totals.rejected += 1
                waiting = self._queue.qsize() + 1
                raise QueueFull(max(1, round(self._totals.mean_request_s * waiting))) from None
            self._totals.in_flight += 1
        return job

    @property
    def idle(self) -> bool:
        """Nothing running or queued: the session may be used directly until the next submit."""
        with self._lock:
            return self._running is None and self._queue.empty()

    def counters(self) -> Counters:
        with self._lock:
            t = self._totals
            return Counters(
                requests_served=t.served, requests_cancelled=t.cancelled, requests_failed=t.failed,
                requests_rejected=t.rejected, in_flight=t.in_flight, running=int(self._running is not None),
                queue_depth=self._queue.qsize(), queue_capacity=self.queue_size, prompt_tokens=t.prompt_tokens,
                generation_tokens=t.generation_tokens, num_drafts=t.num_drafts, num_draft_tokens=t.num_draft_tokens,
                num_accepted_tokens=t.num_accepted_tokens, accepted_per_position=tuple(t.per_position),
                busy_seconds=t.busy_seconds, last_tok_per_s=t.last_tok_per_s,
            )

    # -- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job.started_at = time.perf_counter()
            with self._lock:
                self._running = job
            # A job whose client left while it waited is skipped.
            outcome = Finished("cancelled", RunStats()) if job.cancelled else self._generate(job)
            with self._lock:
                self._running = None
                self._finish(job, outcome, time.perf_counter() - job.started_at)
            # Logged, then answered: a client that has its answer finds the request in the log
            # (and, after the counters, sees them updated).
            self._log(job, outcome)
            job.push(outcome)

    def _generate(self, job: Job) -> Finished | Failed:
        """Streams the Tokens events to the job; returns the outcome (the caller sends it)."""
        request = job.request
        try:
            with self._lock:
                self._totals.prompt_tokens += len(request.prompt_ids)
            events = self.session.speculative(list(request.prompt_ids), request.settings, request.drafter,
                                              cancel=lambda: job.cancelled)
            for event in events:
                if isinstance(event, Tokens):
                    self._count_step(event)
                    job.push(event)
                elif isinstance(event, (Finished, Failed)):
                    return event
            raise RuntimeError("the engine stopped without a result")
        except Exception as exc:  # the worker must outlive any one request
            log.exception("request %s failed", request.request_id)
            return Failed(f"{type(exc).__name__}: {exc}")

    def _count_step(self, event: Tokens) -> None:
        with self._lock:
            t = self._totals
            t.generation_tokens += len(event.token_ids)
            if event.drafted > 0:
                t.num_drafts += 1
                t.num_draft_tokens += event.drafted
                t.num_accepted_tokens += event.accepted
                while len(t.per_position) < event.drafted:
                    t.per_position.append(0)
                for i in range(event.accepted):
                    t.per_position[i] += 1

    def _finish(self, job: Job, outcome: Finished | Failed, seconds: float) -> None:
        t = self._totals
        t.in_flight -= 1
        t.busy_seconds += seconds
        if isinstance(outcome, Failed):
            t.failed += 1
        elif outcome.reason == "cancelled":
            t.cancelled += 1
        else:
            t.served += 1
            t.last_tok_per_s = outcome.stats.decode_tok_per_s or outcome.stats.tok_per_s
            t.mean_request_s = 0.8 * t.mean_request_s + 0.2 * seconds

    def _log(self, job: Job, outcome: Finished | Failed) -> None:
        r = job.request
        if isinstance(outcome, Failed):
            log.warning("%s failed: %s", r.request_id, outcome.error)
            return
        s = outcome.stats
        log.info("%s %s: %d prompt + %d new tokens, %.2f tok/s, drafted %d accepted %d, queued %.2f s",
                 r.request_id, outcome.reason, len(r.prompt_ids), s.new_tokens, s.tok_per_s, s.drafted, s.accepted,
                 job.queue_seconds)
        if self.log_prompts:
            log.info("%s prompt: %r", r.request_id, r.prompt_text)
