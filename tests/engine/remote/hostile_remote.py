"""A hostile "vLLM" on loopback for the remote client's tests: a real threaded HTTP server whose
replies never end, never break a line, drip a byte at a time, ignore ``max_tokens`` or carry
terminal escapes. Each reply is a behaviour: a function of the request handler that writes the
whole response (status, headers, body) and returns when the client hangs up or its byte and
time budget runs out, so a test of an unfixed client ends instead of filling the machine.
"""
from __future__ import annotations

import json
import threading
import time
import zlib
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MB = 1_000_000
BUDGET_BYTES = 300 * MB  # what an endless reply sends at most: an unfixed client grows past any test bound
BUDGET_S = 30.0


class HangUp(Exception):
    """The client closed the connection (or the budget ran out): the behaviour stops writing."""


class Reply:
    """Writes to one client within the budget, and records whether the client hung up."""

    def __init__(self, handler: BaseHTTPRequestHandler, server: "Hostile") -> None:
        self.handler, self.server = handler, server
        self.sent = 0
        self.until = time.monotonic() + BUDGET_S

    def head(self, status: int, content_type: str = "application/json", **headers: str) -> None:
        self.handler.send_response(status)
        self.handler.send_header("Content-Type", content_type)
        for name, value in headers.items():
            self.handler.send_header(name.replace("_", "-"), value)
        self.handler.send_header("Connection", "close")  # no length: the body runs until the socket closes
        self.handler.end_headers()

    def write(self, data: bytes) -> None:
        if self.sent >= BUDGET_BYTES or time.monotonic() > self.until:
            raise HangUp
        try:
            self.handler.wfile.write(data)
            self.handler.wfile.flush()
        except TimeoutError:  # the client neither reads nor hangs up: give up, it did not hang up
            raise HangUp from None
        except OSError:  # BrokenPipe, ConnectionReset: the client stopped reading
            self.server.hung_up.set()
            raise HangUp from None
        self.sent += len(data)

    def endless(self, piece: bytes) -> None:
        while True:
            self.write(piece)


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def token(text: str) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


DONE = b"data: [DONE]\n\n"
FILLER = b"x" * 65536


# -- behaviours: (reply, path) -> None ------------------------------------------------------------
def endless_models(reply: Reply, path: str) -> None:
    reply.head(200)
    reply.write(b'{"object": "list", "data": [')
    reply.endless(b'{"id": "m", "object": "model", "owned_by": "x"}, ' * 1000)


def huge_length_models(reply: Reply, path: str) -> None:
    """A model list that announces a terabyte, then sends it (until the budget)."""
    reply.head(200, Content_Length=str(10**12))
    reply.endless(b" " * 65536)


def endless_error(reply: Reply, path: str) -> None:
    reply.head(500, "text/plain")
    reply.endless(b"Internal Server Error " * 3000)


def huge_metrics(reply: Reply, path: str) -> None:
    """A /metrics page of hundreds of MB (a counter per made-up label), then the usual stream."""
    if path == "/metrics":
        reply.head(200, "text/plain; version=0.0.4")
        line = b'vllm:generation_tokens_total{model_name="m",engine="%d"} 1.0\n'
        reply.endless(b"".join(line % i for i in range(1000)))
    else:
        tokens_then_done(reply, path)


def no_newline_stream(reply: Reply, path: str) -> None:
    reply.head(200, "text/event-stream")
    reply.write(b'data: {"choices": [{"index": 0, "delta": {"content": "')
    reply.endless(FILLER)


def endless_tokens(reply: Reply, path: str) -> None:
    """Valid chunks forever, whatever max_tokens asked for."""
    reply.head(200, "text/event-stream")
    piece = token("tok ")
    reply.endless(piece)


def tokens_then_done(reply: Reply, path: str, n: int = 4) -> None:
    reply.head(200, "text/event-stream")
    for _ in range(n):
        reply.write(token("tok "))
    reply.write(DONE)


def drip_models(reply: Reply, path: str) -> None:
    """The start of a valid model list, then a space (valid JSON) every 50 ms until the budget
    ends: every read returns long before a read timeout, the reply never ends."""
    reply.head(200)
    reply.write(b'{"object": "list", "data": [{"id": "dripped-model"}]')
    while True:
        reply.write(b" ")
        time.sleep(0.05)


def drip_keepalive_stream(reply: Reply, path: str) -> None:
    """An open stream of SSE comments (": keep-alive"), a byte every 50 ms until the budget
    ends: the connection is busy, the reply makes no progress."""
    reply.head(200, "text/event-stream")
    while True:
        for byte in b": keep-alive\n\n":
            reply.write(bytes([byte]))
            time.sleep(0.05)


def gzip_bomb_models(reply: Reply, path: str) -> None:
    """A model list inflated by 300 MB of whitespace, sent gzip-compressed (about 300 kB on the
    wire, whatever the client said it accepts)."""
    reply.head(200, Content_Encoding="gzip")
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    reply.write(packer.compress(b'{"object": "list", "data": [{"id": "m"}]'))
    spaces = b" " * MB
    for _ in range(BUDGET_BYTES // MB):
        reply.write(packer.compress(spaces))
    reply.write(packer.compress(b"}") + packer.flush())


def metrics_label_bomb(reply: Reply, path: str) -> None:
    """A small /metrics page whose per-position counter claims position 100 million, and
    counters at +Inf, then the usual stream."""
    if path != "/metrics":
        tokens_then_done(reply, path)
        return
    reply.head(200, "text/plain; version=0.0.4")
    reply.write(b'vllm:spec_decode_num_drafts_total{model_name="m"} +Inf\n'
                b'vllm:spec_decode_num_draft_tokens_total{model_name="m"} +Inf\n'
                b'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} NaN\n'
                b'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="100000000"} 1.0\n')


def slow_tokens(reply: Reply, path: str) -> None:
    """Ten tokens 0.2 s apart: slow, but progress all the way."""
    reply.head(200, "text/event-stream")
    for _ in range(10):
        time.sleep(0.2)
        reply.write(token("tok "))
    reply.write(DONE)


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b1m\r"


def escape_error(reply: Reply, path: str) -> None:
    reply.head(500)
    reply.write(json.dumps({"error": {"message": f"boom {ESCAPES} done", "code": 500}}).encode())


def escape_models_and_text(reply: Reply, path: str) -> None:
    if path.endswith("/models"):
        reply.head(200)
        reply.write(json.dumps({"data": [{"id": f"evil{ESCAPES}model"}]}).encode())
        return
    reply.head(200, "text/event-stream")
    reply.write(token(f"line one\n\tindented {ESCAPES} end"))
    reply.write(DONE)


def junk_counts_stream(reply: Reply, path: str) -> None:
    """Four tokens, then usage and timings whose counts are not numbers."""
    reply.head(200, "text/event-stream")
    for _ in range(4):
        reply.write(token("tok "))
    reply.write(sse({"choices": [], "usage": {"completion_tokens": "lots"},
                     "timings": {"draft_n": "x", "draft_n_accepted": None}}) + DONE)


def garbage_stream(reply: Reply, path: str) -> None:
    reply.head(200, "text/event-stream")
    reply.write(token("ok ") + b"data: {not json\n\n" + DONE)


def scalar_stream(reply: Reply, path: str) -> None:
    reply.head(200, "text/event-stream")
    reply.write(b"data: 5\n\n" + DONE)


def nested_models(reply: Reply, path: str) -> None:
    """A small body that is deeper JSON than Python's parser can recurse into."""
    reply.head(200)
    reply.write(b"[" * 200_000)


def scalar_models(reply: Reply, path: str) -> None:
    reply.head(200)
    reply.write(b'{"data": ["a", 5]}')


BEHAVIOURS = {f.__name__: f for f in (endless_models, endless_error, huge_metrics, no_newline_stream, endless_tokens,
                                      tokens_then_done, drip_models, drip_keepalive_stream, slow_tokens,
                                      gzip_bomb_models, huge_length_models, metrics_label_bomb, junk_counts_stream,
                                      escape_error, escape_models_and_text, garbage_stream, scalar_stream,
                                      nested_models, scalar_models)}


class Hostile(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, behaviour) -> None:
        self.behaviour = behaviour
        self.hung_up = threading.Event()  # a client closed its connection mid-reply
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    timeout = BUDGET_S  # a write to a client that neither reads nor hangs up ends (socket timeout)

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        try:
            self.server.behaviour(Reply(self, self.server), self.path.split("?")[0])
        except HangUp:
            pass
        self.close_connection = True

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # quiet
        pass


@contextmanager
def hostile(behaviour):
    """A Hostile server in a thread for the duration of the block."""
    server = Hostile(BEHAVIOURS[behaviour] if isinstance(behaviour, str) else behaviour)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="hostile-remote")
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()

