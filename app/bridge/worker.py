"""The one adapter between Qt and the engine.

A single worker thread owns the loaded models and runs one job at a time from a queue. Jobs are
plain functions that call ``ctx.emit(payload)``; each payload crosses to the GUI thread through
one ``Signal(object)``. Cancelling is cooperative: jobs check ``ctx.cancelled()`` between steps
(the engine does so between decoding steps). torch is imported here, on the worker, never on
the GUI thread, so the window shows before the heavy imports.
"""
from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.bridge.messages import JobEnded, JobEvent, JobFailed
from app.bridge.worker_state import WorkerState

log = logging.getLogger(__name__)
_ids = itertools.count(1)


@dataclass
class Job:
    kind: str
    run: Callable[["JobContext"], None]
    id: int = field(default_factory=lambda: next(_ids))
    cancel_flag: threading.Event = field(default_factory=threading.Event)


class JobContext:
    """What a running job sees: where to send events, whether to stop, shared worker state."""

    def __init__(self, worker: "EngineWorker", job: Job) -> None:
        self.worker = worker
        self.job = job

    def emit(self, payload: object) -> None:
        self.worker.event.emit(JobEvent(self.job.id, self.job.kind, payload))

    def cancelled(self) -> bool:
        return self.job.cancel_flag.is_set()

    @property
    def state(self) -> WorkerState:
        return self.worker.state


class EngineWorker(QObject):
    event = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._current: Job | None = None
        self._lock = threading.Lock()
        self.state = WorkerState()  # lives on the worker thread: the loaded session and friends

    def submit(self, job: Job) -> int:
        self._queue.put(job)
        return job.id

    def cancel_all(self) -> None:
        """Stop the running job at its next check and drop queued ones. Thread-safe."""
        with self._lock:
            if self._current is not None:
                self._current.cancel_flag.set()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:  # keep a pending shutdown request
                self._queue.put(None)
                break
            job.cancel_flag.set()
            self.event.emit(JobEvent(job.id, job.kind, JobEnded(cancelled=True)))

    def stop(self) -> None:
        self.cancel_all()
        self._queue.put(None)

    @Slot()
    def loop(self) -> None:
        while (job := self._queue.get()) is not None:
            with self._lock:
                self._current = job
            ctx = JobContext(self, job)
            try:
                if not job.cancel_flag.is_set():
                    job.run(ctx)
            except Exception as exc:  # a job never kills the worker; the window shows the error
                log.exception("job %s failed", job.kind)
                ctx.emit(JobFailed(readable_error(exc)))
            finally:
                with self._lock:
                    self._current = None
                ctx.emit(JobEnded(cancelled=job.cancel_flag.is_set()))
        self.state.close()  # tool servers stopped, models dropped on the thread that used them


def readable_error(exc: BaseException) -> str:
    if isinstance(exc, (ValueError, FileNotFoundError, PermissionError)):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "ran out of memory: choose a smaller model, a shorter context or exact→fast precision"
    return f"{type(exc).__name__}: {exc}"


class EngineHost(QObject):
    """Owns the worker thread: start once, submit jobs, shut down cleanly on close."""

    event = Signal(object)
    instances: "weakref.WeakSet[EngineHost]" = weakref.WeakSet()  # tests check none is left running

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        EngineHost.instances.add(self)
        self.thread = QThread()
        self.thread.setObjectName("tandem-engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        self.worker.event.connect(self.event)
        self.thread.started.connect(self.worker.loop)
        self.thread.start()

    def submit(self, kind: str, run: Callable[[JobContext], None]) -> int:
        return self.worker.submit(Job(kind, run))

    def cancel(self) -> None:
        self.worker.cancel_all()

    def shutdown(self, timeout_ms: int | None = None) -> bool:
        """Cancel, let the running step finish, join the thread. True when it stopped.

        Decoding stops at its next step; a step that cannot be cancelled (a kernel's first
        compile, a model's load from disk) may run on for minutes, and quitting must not wait for
        it: after ``QUIT_WAIT_MS`` the thread is left running and ``leave`` ends the process."""
        if not self.thread.isRunning():
            return True
        self.worker.stop()
        self.thread.quit()
        timeout_ms = QUIT_WAIT_MS if timeout_ms is None else timeout_ms
        stopped = self.thread.wait(timeout_ms)
        if not stopped:
            log.warning("the engine is inside a step that cannot be cancelled (%d ms); quitting without it", timeout_ms)
        return stopped


#: How long closing the window waits for the engine's current step to end.
QUIT_WAIT_MS = 10_000


def still_running() -> list[EngineHost]:
    """Engine hosts whose thread outlived shutdown (a step that cannot be cancelled)."""
    return [host for host in list(EngineHost.instances) if host.thread.isRunning()]


def leave(code: int) -> int:
    """The process's exit once the window has closed. With an engine thread still inside a step
    that cannot be cancelled, Python's teardown would destroy its running QThread, which Qt
    answers with an abort (and a crash log for a clean quit). So then: stop the compilers it
    started, flush the logs and end the process at once; every file the engine writes (weight
    caches, kernel builds, conversions) is written to a temporary name and renamed, so nothing
    half-written is left for the next start to trust."""
    if not still_running():
        return code
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:  # already gone
            pass
    log.warning("quit while the engine was busy; its step was abandoned")
    logging.shutdown()
    os._exit(code)
