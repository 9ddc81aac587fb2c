"""What the engine thread holds between jobs: the loaded Session or the remote model chosen
instead, the built-in server on that Session, the tool servers, and the lock that keeps two
generations off the model at once.

It lives on the worker (app.bridge.worker) and every job reaches it through its context; the
jobs that replace the model (a load, a remote model) drop the old one through ``drop_model``,
so none of them needs to know how another keeps its part.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the engine is imported on the worker thread, lazily
    from app.bridge.tool_jobs import McpPool
    from engine.serving.server import ServerHandle
    from engine.session.session import Session

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteChoice:
    """A model on another server, chosen as the window's model."""

    url: str
    api_key: str | None
    model: str


@dataclass
class WorkerState:
    session: Session | None = None
    remote: RemoteChoice | None = None
    server: ServerHandle | None = None
    tools: McpPool | None = None
    #: Models already told that they take no tools (the notice is said once per model).
    tools_refused_for: set[str] = field(default_factory=set)
    #: Held for a whole generation by the window's jobs and by the server's requests.
    generation_lock: threading.Lock = field(default_factory=threading.Lock)
    #: What jobs started outside this process, stopped when the worker ends.
    at_exit: list[Callable[[], None]] = field(default_factory=list)

    def stop_server(self) -> None:
        """Stop the built-in server, if one runs (it decodes on the Session about to go)."""
        handle, self.server = self.server, None
        if handle is not None:
            stop_handle(handle)

    def drop_model(self) -> None:
        """Free the window's model before another replaces it: the server that serves it stops
        first, the local Session and any remote choice are forgotten."""
        self.stop_server()
        self.session = None
        self.remote = None

    def close(self) -> None:
        """Stop what the jobs started and drop the models (on the worker thread that used them)."""
        hooks, self.at_exit = self.at_exit, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # one that fails must not keep the others from stopping
                log.exception("stopping %s failed", hook)
        # Dropped, not stopped: the window stops its server itself when it closes.
        self.session = self.remote = self.server = self.tools = None


def stop_handle(handle) -> None:
    """Stop a server and the serving worker the app made for it."""
    handle.stop()
    worker = getattr(handle, "app_worker", None)
    if worker is not None:
        worker.stop()
