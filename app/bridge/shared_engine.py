"""One loaded Session, two users: the window's jobs and the built-in OpenAI server.

The window's jobs run on the app's engine thread; the server (engine.serving) decodes on a
thread of its own. They share the Session through one lock held for a whole generation: a
server request that arrives while a chat reply runs waits for it (and the window's next job
waits for the running request), so two generations never run on the model at once. The lock
lives in the worker's state beside the Session (app.bridge.worker_state), so both sides find
the same one.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

_POLL_S = 0.05


@contextmanager
def holding(lock: threading.Lock, cancelled=lambda: False):
    """Hold ``lock`` for the body; a job cancelled while it waits gives up (``False``)."""
    while not lock.acquire(timeout=_POLL_S):
        if cancelled():
            yield False
            return
    try:
        yield True
    finally:
        lock.release()


class LockedSession:
    """The Session as the server's worker sees it: each generation holds the shared lock;
    everything else (tokenizer, target, drafter) is the Session's own."""

    def __init__(self, session, lock: threading.Lock) -> None:
        self._session = session
        self._lock = lock

    def speculative(self, prompt_ids, settings, drafter, cancel=None):
        cancelled = cancel or (lambda: False)
        with holding(self._lock, cancelled) as held:
            if not held:  # the request was cancelled while the window's job ran
                from engine.core.events import Finished, RunStats

                yield Finished("cancelled", RunStats())
                return
            yield from self._session.speculative(prompt_ids, settings, drafter, cancel=cancel)

    def __getattr__(self, name):
        return getattr(self._session, name)

    def __setattr__(self, name, value):
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._session, name, value)
