"""Starting and stopping the built-in OpenAI server on the model the window has loaded.

The start runs as a job on the app's engine thread (where the Session lives); the server then
decodes on its own thread, sharing the Session through app.bridge.shared_engine's lock. Stopping is a
plain call on any thread (the panel uses a short-lived one, never the GUI thread).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from app.bridge.shared_engine import LockedSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerStarted:
    handle: object  # engine.serving.server.ServerHandle
    url: str
    model_id: str


@dataclass(frozen=True)
class ServerFailed:
    message: str


def start_server(host: str, port: int, api_key: str | None):
    def run(ctx) -> None:
        from engine.serving.server import ServerConfig, is_loopback, run_in_thread
        from engine.serving.worker import ServingWorker

        session = ctx.state.session
        if session is None:
            ctx.emit(ServerFailed("no model is loaded yet: load one on the Models tab"))
            return
        ctx.state.stop_server()
        try:
            config = ServerConfig(host=host, port=port, api_key=api_key or None, allow_remote=not is_loopback(host))
            config.check()
            worker = ServingWorker(LockedSession(session, ctx.state.generation_lock), config.queue_size)
            handle = run_in_thread(worker, config)
        except (ValueError, OSError) as exc:
            ctx.emit(ServerFailed(str(exc)))
            return
        handle.app_worker = worker  # stopped with the server: the app made it, not run_in_thread
        ctx.state.server = handle
        log.info("serving %s at %s", session.target.name, handle.url)
        ctx.emit(ServerStarted(handle, handle.url, worker.model_id))

    return run
