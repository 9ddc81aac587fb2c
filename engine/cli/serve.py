"""`tandem serve`: an OpenAI-compatible server on the loaded pair (see docs/serving.md)."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from engine.cli.common import load_session, model_options


def run_serve(args) -> int:
    from engine.serving.server import ServerConfig, bind_socket, run_in_thread
    from engine.session.compare import warm_up

    config = ServerConfig(
        host=args.host, port=args.port, api_key=args.api_key or os.environ.get("TANDEM_API_KEY") or None,
        allow_remote=args.allow_remote, cors_origins=tuple(args.cors_origin or ()),
        allowed_hosts=tuple(args.allowed_host or ()), queue_size=args.queue_size,
        read_timeout_s=args.read_timeout, max_connections=args.max_connections,
        log_prompts=args.log_prompts, model_id=args.model_id, default_drafter=args.drafter,
        default_max_tokens=args.max_new_tokens,
    )
    config.check()  # refuse an unsafe configuration before spending a minute on loading
    sock = bind_socket(config.host, config.port)  # ... and a busy port too
    try:
        session = load_session(args, need_drafter=args.drafter == "model")
        if session.drafter_note:
            print(f"note: {session.drafter_note}", file=sys.stderr)
        print("warming up", file=sys.stderr)
        warm_up(session, args.drafter)
        logging.getLogger("engine.serving").setLevel(logging.INFO)  # one line per request
        handle = run_in_thread(session, config, sock=sock)
    except BaseException:
        sock.close()
        raise
    stop = _stop_on_signals()
    try:
        print(f"serving {handle.worker.model_id} at {handle.url}/v1 (OpenAI API; Ctrl-C stops)", flush=True)
        if config.api_key:
            print("clients must send: Authorization: Bearer <your key>", flush=True)
        while handle.running and not stop.wait(0.5):
            pass
        print("stopping", file=sys.stderr)
    finally:
        handle.stop()
    return 0


def _stop_on_signals() -> threading.Event:
    """An event that Ctrl-C (SIGINT) or a service manager's SIGTERM sets; a second one exits at
    once. Why not KeyboardInterrupt: raised wherever the main thread happens to be (inside a
    thread join, a print), it could leave the shutdown half done; a flag is read in one place."""
    stop = threading.Event()

    def request_stop(signum, frame) -> None:
        if stop.is_set():
            os._exit(128 + signum)  # asked twice: the user wants out now
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, request_stop)
    return stop


def add_parser(sub) -> None:
    from engine.serving.server import DEFAULT_PORT

    p = sub.add_parser("serve", help="serve the models over an OpenAI-compatible HTTP API")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 and /metrics (or set TANDEM_API_KEY)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (needs --api-key as well)")
    p.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="allow browser requests from ORIGIN (repeatable; default: no CORS)")
    p.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="also answer requests sent to NAME (the Host header; repeatable; '*': any). "
                        "Default: loopback and the --host address only")
    p.add_argument("--queue-size", type=int, default=16,
                   help="requests that may wait behind the running one; more get 429 (default 16)")
    p.add_argument("--read-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a request's headers, and then its body, must each arrive within SECONDS; "
                        "slower clients are disconnected (default 30)")
    p.add_argument("--max-connections", type=int, default=64,
                   help="open connections served at once; requests on more get 503 (default 64)")
    p.add_argument("--log-prompts", action="store_true", help="write prompts to the log (default: never)")
    p.add_argument("--model-id", help="the model name clients send (default: the target folder's name)")
    model_options(p)
    # A reply's default length when a request sends no max_tokens (model_options' 128 suits a demo).
    p.set_defaults(func=run_serve, max_new_tokens=2048)
