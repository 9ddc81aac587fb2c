"""Starting and stopping the server, in-process: the CLI and the app share this.

    config = ServerConfig(port=0)                 # 0: any free port
    handle = run_in_thread(session, config)       # returns once it accepts connections
    handle.url, handle.counters()                 # "http://127.0.0.1:PORT", live Counters
    handle.stop()                                 # cancels what runs, closes the port

Security by default: it binds to loopback; another address needs ``allow_remote`` AND an API
key (``check`` refuses otherwise); with a key every /v1 endpoint and /metrics need
``Authorization: Bearer KEY``; no CORS headers unless origins are given; prompts stay out of
the logs unless ``log_prompts``. Web pages cannot drive it (engine.serving.guard: Host, Origin
and Content-Type checks); a slow client is disconnected after ``read_timeout_s`` and at most
``max_connections`` are served (engine.serving.http_protocol).
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from engine.serving.guard import BrowserGuard, HostPolicy
from engine.serving.http_protocol import with_read_timeout
from engine.serving.openai_api import (ApiSettings, OpenAiApi, api_error_response, http_error_response,
                                       internal_error_response)
from engine.serving.schemas import ApiError
from engine.serving.worker import Counters, ServingWorker
from engine.session.session import Session

log = logging.getLogger(__name__)

DEFAULT_PORT = 8080  # llama-server's; LM Studio uses 1234, Jan 1337, Ollama 11434


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    allow_remote: bool = False
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides loopback and the bound one ("*": any)
    queue_size: int = 16  # requests waiting behind the running one before a 429
    read_timeout_s: float = 30.0  # for a request's headers, and then for its body (engine.serving.http_protocol)
    max_connections: int = 64  # open connections served at once; requests on more get a 503
    log_prompts: bool = False
    model_id: str | None = None  # the name clients send as "model" (default: the target's)
    default_drafter: str = "model"  # when a request does not choose: model, lookup or mtp
    default_max_tokens: int = 2048  # when a request sends no max_tokens

    def check(self) -> None:
        """Refuse a configuration that would expose the engine unprotected."""
        if not is_loopback(self.host):
            if not self.allow_remote:
                raise ValueError(f"binding to {self.host} lets other machines reach the server: "
                                 "pass --allow-remote and --api-key to do that")
            if not self.api_key:
                raise ValueError(f"binding to {self.host} needs an API key (--api-key): anyone on the network "
                                 "could use the model otherwise")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty")
        if self.queue_size < 1:
            raise ValueError("the queue size must be at least 1")
        if not self.read_timeout_s > 0:
            raise ValueError("the read timeout must be a positive number of seconds")
        if self.max_connections < 1:
            raise ValueError("the connection limit must be at least 1")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not a TCP port")
        if self.default_drafter not in ("model", "lookup", "mtp", "off"):
            raise ValueError(f"unknown drafter {self.default_drafter!r}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: loopback only if every address it names is
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def build_app(worker: ServingWorker, config: ServerConfig) -> Starlette:
    """The ASGI app over a (started) worker."""
    config.check()
    api = OpenAiApi(worker, ApiSettings(
        model_id=config.model_id or worker.model_id, api_key=config.api_key, default_drafter=config.default_drafter,
        default_max_tokens=config.default_max_tokens, log_prompts=config.log_prompts,
    ))
    # The guard first: a foreign Host or Origin is refused before CORS or a route sees it.
    middleware = [Middleware(BrowserGuard, policy=HostPolicy(config.host, config.allowed_hosts, config.cors_origins))]
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST", "OPTIONS"],
                                     allow_headers=["Authorization", "Content-Type"]))
    app = Starlette(routes=api.routes(), middleware=middleware, exception_handlers={
        ApiError: api_error_response, HTTPException: http_error_response, Exception: internal_error_response,
    })
    app.state.api = api
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before a model loads, so a busy port fails in a second rather than after the load."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


class ServerHandle:
    """A running server: its address, live counters, and ``stop``."""

    def __init__(self, server, thread: threading.Thread, sock: socket.socket, worker: ServingWorker,
                 owns_worker: bool) -> None:
        self._server = server
        self._thread = thread
        self._socket = sock
        self.worker = worker
        self._owns_worker = owns_worker
        host, port = sock.getsockname()[:2]
        self.host, self.port = host, port
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"

    def counters(self) -> Counters:
        return self.worker.counters()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self) -> None:
        """Block until the server stops (the CLI: until Ctrl-C)."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self, timeout: float = 10.0) -> None:
        self.worker.cancel_all()  # open streams end at the engine's next step
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._owns_worker:
            self.worker.stop()
        self._socket.close()

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_in_thread(engine: Session | ServingWorker, config: ServerConfig, sock: socket.socket | None = None,
                  startup_timeout: float = 30.0) -> ServerHandle:
    """Serve ``engine`` (a loaded Session, or an ServingWorker the caller keeps) from a background
    thread; returns once the server accepts connections. ``sock``: one from ``bind_socket``.
    Anything that is not an ServingWorker is taken for a Session (or a wrapper with its methods)
    and gets a worker that ``stop`` stops."""
    import uvicorn

    config.check()
    owns_worker = not isinstance(engine, ServingWorker)
    worker = ServingWorker(engine, config.queue_size, config.log_prompts) if owns_worker else engine
    worker.start()
    app = build_app(worker, config)
    sock = sock or bind_socket(config.host, config.port)
    # Logs go through the root logger (no uvicorn formatting); per-request lines come from
    # engine.serving.worker, without prompts unless asked.
    # uvicorn counts the connection asking among the open ones (503 once they reach the limit),
    # so max_connections of them are served with a limit one higher.
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=5, http=with_read_timeout(config.read_timeout_s),
                                           limit_concurrency=config.max_connections + 1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="tandem-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            if owns_worker:
                worker.stop()
            sock.close()
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    handle = ServerHandle(server, thread, sock, worker, owns_worker)
    log.info("serving %s at %s", worker.model_id, handle.url)
    return handle
