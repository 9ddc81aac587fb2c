"""An OpenAI-compatible HTTP client for remote engines: models, streamed chat / completions
with the arrival time of every chunk, ``usage`` and llama.cpp-style ``timings``, /metrics.

httpx (the ``httpx2`` distribution, which the openai package uses too) does the HTTP; SSE lines
are read as they arrive so each chunk is timed when it lands, not when the reply ends.

Nothing a server sends is read without a limit (``Limits``): a model list, a /metrics page and
one stream line have byte caps, an error body is read for its first few kB only, a whole stream
is capped by its ``max_tokens``; a plain reply must be over within min(timeout_s, 30 s), a stream
must bring text at least every ``timeout_s`` (keep-alive comments are not text) and end within an
hour, and it stops after ``max_tokens`` chunks of text (each carries at least one token) however
long the server goes on. A limit reached is a RemoteError naming the URL and the limit, and the
connection is dropped, not drained. A deadline is checked as each piece arrives, and the socket's
read timeout is at most the same time, so a server that stops sending is caught within twice it.
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx2 as httpx

from engine.remote.text import clipped

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 300.0  # a long prompt on a busy server can take minutes to its first token
KB, MB = 1_000, 1_000_000


@dataclass(frozen=True)
class Limits:
    """The most a client reads from a server, and how long it waits for it."""

    models_bytes: int = 4 * MB  # /v1/models (vLLM's list of one model is ~300 bytes)
    metrics_bytes: int = 8 * MB  # /metrics (vLLM's, histograms and all, is ~100 kB; 8 MB parse in ~5 s)
    error_bytes: int = 4 * KB  # of an error reply's body: read and kept for the message, the rest not read
    line_bytes: int = 1 * MB  # one SSE line, i.e. one event's JSON
    stream_bytes: int = 64 * MB  # a whole stream: this much, plus the next line's allowance per max_tokens
    stream_bytes_per_token: int = 64 * KB  # (logprobs make chunks of a few kB)
    request_s: float = 30.0  # a whole plain reply (models, metrics, an error body), and never over timeout_s
    stream_s: float = 3600.0  # a whole stream


class RemoteError(Exception):
    """The endpoint could not be reached, refused the request, or answered something else."""


class _Unreachable(RemoteError):
    """No answer at all: refused, reset, or nothing within the read timeout."""


@dataclass(frozen=True)
class RemoteEndpoint:
    url: str  # the server's base, with or without /v1: http://gpu-box:8000 or http://gpu-box:8000/v1
    api_key: str | None = None

    @property
    def api_base(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith("/v1") else base + "/v1"

    @property
    def root(self) -> str:
        base = self.url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True)
class RemoteModel:
    id: str
    owned_by: str = ""
    max_model_len: int | None = None  # vLLM's field; others leave it out


@dataclass(frozen=True)
class Chunk:
    """New text of a stream, and when it arrived (perf_counter seconds)."""

    text: str
    at: float


@dataclass(frozen=True)
class StreamEnd:
    """The end of a stream: everything the server said about the request."""

    text: str
    finish_reason: str | None
    started: float  # when the request was sent (perf_counter seconds)
    first_chunk_at: float | None
    last_chunk_at: float | None
    chunks: int
    usage: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # llama.cpp / tandem per-request timings, if sent
    metrics: dict = field(default_factory=dict)  # vLLM's per-request "metrics", if sent


class RemoteClient:
    def __init__(self, endpoint: RemoteEndpoint, timeout_s: float = READ_TIMEOUT_S, limits: Limits = Limits()) -> None:
        """``timeout_s``: the longest wait for a plain reply (at most ``limits.request_s``) or for
        a stream's next text (its first token included)."""
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.limits = limits
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RemoteClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests ----------------------------------------------------------------------------
    @contextmanager
    def _request(self, method: str, url: str, wait: float, **kwargs) -> Iterator[httpx.Response]:
        """The response, its body not read yet; httpx's errors as RemoteErrors."""
        try:
            with self._http.stream(method, url, timeout=httpx.Timeout(wait, connect=CONNECT_TIMEOUT_S),
                                   **kwargs) as response:
                yield response
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            raise _Unreachable(f"{url} sent nothing for {wait:g} s (the read timeout); stopped waiting") from exc
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise _Unreachable(f"{self.endpoint.url} cannot be reached: {clipped(str(exc))}") from exc
        except httpx.HTTPError as exc:  # reset mid-body, a broken chunked encoding, a bad header...
            raise _Unreachable(f"{url}: {type(exc).__name__}: {clipped(str(exc))}") from exc

    def _body(self, response: httpx.Response, url: str, cap: int, what: str, deadline: float, wait: float) -> bytes:
        """The whole body, or a RemoteError past ``cap`` bytes or the deadline."""
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > cap:
            raise RemoteError(f"{url} announced {_size(int(length))} for {what}, over the limit of {_size(cap)}; "
                              "not read")
        body = bytearray()
        for piece in response.iter_bytes():  # decoded, in bounded pieces even from a compressed body
            body += piece
            if len(body) > cap:
                raise RemoteError(f"{url} sent more than {_size(cap)} for {what} (the limit); stopped reading")
            if time.monotonic() > deadline:
                raise RemoteError(f"{url} took longer than {wait:g} s to send {what} (the limit for a whole "
                                  "reply); stopped waiting")
        return bytes(body)

    def _fail(self, response: httpx.Response, url: str, deadline: float) -> None:
        """Raise the RemoteError of a refused request, from the first kB of its body."""
        body = bytearray()
        try:
            for piece in response.iter_bytes():
                body += piece
                if len(body) >= self.limits.error_bytes or time.monotonic() > deadline:
                    break
        except httpx.HTTPError:  # what came before the failure is the message
            pass
        hint = " (check the API key)" if response.status_code == 401 else ""
        raise RemoteError(f"{url} answered {response.status_code}: "
                          f"{_message_of(bytes(body[: self.limits.error_bytes]))}{hint}")

    def _get(self, url: str, cap: int, what: str) -> bytes:
        wait = min(self.timeout_s, self.limits.request_s)
        deadline = time.monotonic() + wait
        with self._request("GET", url, wait) as response:
            if response.status_code != 200:
                self._fail(response, url, deadline)
            return self._body(response, url, cap, what, deadline, wait)

    def list_models(self) -> list[RemoteModel]:
        url = self.endpoint.api_base + "/models"
        body = self._get(url, self.limits.models_bytes, "a model list")
        try:
            data = json.loads(body)["data"]
            return [RemoteModel(str(m["id"]), str(m.get("owned_by", "")), _length(m.get("max_model_len")))
                    for m in data]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise RemoteError(f"{url} is not an OpenAI model list") from exc

    def metrics_text(self) -> str | None:
        """The Prometheus exposition at /metrics, or None when the server has none (404, or
        llama.cpp's server without --metrics) or does not answer; a RemoteError when the page
        is over its limit or slower than the deadline."""
        url = self.endpoint.root + "/metrics"
        wait = min(self.timeout_s, self.limits.request_s)
        deadline = time.monotonic() + wait
        try:
            with self._request("GET", url, wait) as response:
                if response.status_code != 200:
                    return None
                body = self._body(response, url, self.limits.metrics_bytes, "a /metrics page", deadline, wait)
        except _Unreachable:
            return None
        return body.decode("utf-8", "replace")

    # -- streams -----------------------------------------------------------------------------
    def stream_chat(self, model: str, messages: list[dict], **fields) -> Iterator[Chunk | StreamEnd]:
        body = {"model": model, "messages": messages, **fields}
        return self._stream("/chat/completions", body, chat=True)

    def stream_completion(self, model: str, prompt: str, **fields) -> Iterator[Chunk | StreamEnd]:
        body = {"model": model, "prompt": prompt, **fields}
        return self._stream("/completions", body, chat=False)

    def _stream(self, path: str, body: dict, chat: bool) -> Iterator[Chunk | StreamEnd]:
        body = {**body, "stream": True}
        body.setdefault("stream_options", {"include_usage": True})
        url = self.endpoint.api_base + path
        max_tokens = _max_tokens(body)
        cap = self.limits.stream_bytes + (max_tokens or 0) * self.limits.stream_bytes_per_token
        wait = min(self.timeout_s, self.limits.stream_s)
        started = time.perf_counter()
        begun = time.monotonic()
        deadline, progress_by = begun + self.limits.stream_s, begun + self.timeout_s
        parts: list[str] = []
        first = last = None
        finish = None
        usage: dict = {}
        timings: dict = {}
        metrics: dict = {}
        chunks = 0
        per_choice: dict[int, int] = {}  # chunks of text (or reasoning) of each choice
        with self._request("POST", url, wait, json=body) as response:
            if response.status_code != 200:
                self._fail(response, url, begun + min(wait, self.limits.request_s))
            lines = _Lines(self.limits.line_bytes)
            received = 0
            done = False
            pieces = response.iter_bytes()
            while not done:
                piece = next(pieces, None)
                if piece is None:
                    new_lines, done = lines.rest(), True  # the body ended without [DONE]
                else:
                    received += len(piece)
                    if received > cap:
                        limit = f"max_tokens={max_tokens}" if max_tokens else "a stream"
                        raise RemoteError(f"{url} sent more than {_size(cap)} in one stream (the limit for {limit}); "
                                          "stopped reading")
                    try:
                        new_lines = lines.feed(piece)
                    except _LineTooLong:
                        raise RemoteError(f"{url} sent a stream line longer than {_size(self.limits.line_bytes)} "
                                          "(the limit for one event); stopped reading") from None
                for raw in new_lines:
                    line = raw.decode("utf-8", "replace")
                    if not line.startswith("data:"):
                        continue  # comments (": keep-alive"), event names, blank separators
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = _event(url, data)
                    if "error" in chunk:
                        raise RemoteError(f"{url} reported an error mid-stream: {_message_of_json(chunk)}")
                    usage = _dict(chunk.get("usage")) or usage
                    timings = _dict(chunk.get("timings")) or timings
                    metrics = _dict(chunk.get("metrics")) or metrics
                    choices = chunk.get("choices")
                    for choice in choices if isinstance(choices, list) else ():
                        if not isinstance(choice, dict):
                            continue
                        delta = _dict(choice.get("delta")) if chat else choice
                        text = delta.get("content") if chat else delta.get("text")
                        text = text if isinstance(text, str) else None
                        reason = choice.get("finish_reason")
                        finish = reason if isinstance(reason, str) and reason else finish
                        if not (text or _reasoning(delta)):
                            continue
                        index = choice.get("index") if isinstance(choice.get("index"), int) else 0
                        per_choice[index] = per_choice.get(index, 0) + 1
                        if max_tokens and per_choice[index] > max_tokens:
                            raise RemoteError(f"{url} kept streaming past max_tokens={max_tokens} "
                                              f"({per_choice[index]} chunks of text, each at least a token); "
                                              "stopped reading")
                        now = time.perf_counter()
                        progress_by = time.monotonic() + self.timeout_s
                        if text:
                            first = first if first is not None else now
                            last = now
                            chunks += 1
                            parts.append(text)
                            yield Chunk(text, now)
                now = time.monotonic()
                if not done and now > deadline:
                    raise RemoteError(f"{url} streamed for longer than {self.limits.stream_s:g} s (the limit for "
                                      "a whole stream); stopped reading")
                if not done and now > progress_by:
                    raise RemoteError(f"{url} sent no text for {self.timeout_s:g} s (the timeout for each token); "
                                      "stopped waiting")
        yield StreamEnd("".join(parts), finish, started, first, last, chunks, usage, timings, metrics)


class _LineTooLong(Exception):
    pass


_EOL = re.compile(rb"\r\n|\r|\n")


class _Lines:
    """SSE lines out of the pieces of a body, none longer than ``limit`` bytes. A CRLF split
    across two pieces reads as an extra blank line, which SSE ignores here."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = bytearray()

    def feed(self, piece: bytes) -> list[bytes]:
        if b"\n" not in piece and b"\r" not in piece:
            self.pending += piece
            if len(self.pending) > self.limit:
                raise _LineTooLong
            return []
        lines = _EOL.split(bytes(self.pending) + piece)
        self.pending = bytearray(lines.pop())
        if len(self.pending) > self.limit or any(len(line) > self.limit for line in lines):
            raise _LineTooLong
        return lines

    def rest(self) -> list[bytes]:
        rest, self.pending = bytes(self.pending), bytearray()
        return [rest] if rest else []


def _event(url: str, data: str) -> dict:
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError):
        raise RemoteError(f"{url} sent a stream event that is not JSON: {clipped(data, 80)}") from None
    if not isinstance(chunk, dict):
        raise RemoteError(f"{url} sent a stream event that is not a JSON object: {clipped(data, 80)}")
    return chunk


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _reasoning(delta: dict) -> bool:
    """A chunk of a reasoning model's thinking (vLLM's field names): tokens too."""
    return any(isinstance(delta.get(name), str) and delta.get(name) for name in ("reasoning_content", "reasoning"))


def _max_tokens(body: dict) -> int | None:
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _length(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _size(n: int) -> str:
    value, unit = (n / MB, "MB") if n >= MB else (n / KB, "kB")
    return f"{value:,.0f} {unit}" if value >= 1000 else f"{value:g} {unit}"


def _message_of_json(body) -> str:
    if not isinstance(body, dict):
        return clipped(str(body))
    error = body.get("error")
    if isinstance(error, dict):
        return clipped(str(error.get("message") or error))
    return clipped(str(error or body))


def _message_of(body: bytes) -> str:
    """The message of an error body: OpenAI's ``{"error": {"message": ...}}``, else its text."""
    try:
        return _message_of_json(json.loads(body))
    except (ValueError, RecursionError):
        return clipped(body.decode("utf-8", "replace"), 200)
