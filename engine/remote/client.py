"""An OpenAI-compatible HTTP client for remote engines: models, streamed chat / completions
with the arrival time of every chunk, ``usage`` and llama.cpp-style ``timings``, /metrics.

httpx (the ``httpx2`` distribution, which the openai package uses too) does the HTTP; SSE lines
are read as they arrive so each chunk is timed when it lands, not when the reply ends.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx2 as httpx

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 300.0  # a long prompt on a busy server can take minutes to its first token


class RemoteError(Exception):
    """The endpoint could not be reached, refused the request, or answered something else."""


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
    def __init__(self, endpoint: RemoteEndpoint, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.endpoint = endpoint
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RemoteClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plain requests ----------------------------------------------------------------------
    def _get(self, url: str) -> httpx.Response:
        try:
            return self._http.get(url)
        except httpx.HTTPError as exc:
            raise RemoteError(f"{self.endpoint.url} cannot be reached: {exc}") from exc

    def list_models(self) -> list[RemoteModel]:
        response = self._get(self.endpoint.api_base + "/models")
        _raise_for(response)
        try:
            data = response.json()["data"]
            return [RemoteModel(str(m["id"]), str(m.get("owned_by", "")), m.get("max_model_len")) for m in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise RemoteError(f"{self.endpoint.url}/v1/models is not an OpenAI model list") from exc

    def metrics_text(self) -> str | None:
        """The Prometheus exposition at /metrics, or None when the server has none (404, or
        llama.cpp's server without --metrics)."""
        try:
            response = self._http.get(self.endpoint.root + "/metrics")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return response.text

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
        started = time.perf_counter()
        parts: list[str] = []
        first = last = None
        finish = None
        usage: dict = {}
        timings: dict = {}
        metrics: dict = {}
        chunks = 0
        try:
            with self._http.stream("POST", self.endpoint.api_base + path, json=body) as response:
                if response.status_code != 200:
                    response.read()
                    _raise_for(response)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise RemoteError(_error_text(chunk))
                    usage = chunk.get("usage") or usage
                    timings = chunk.get("timings") or timings
                    metrics = chunk.get("metrics") or metrics
                    for choice in chunk.get("choices") or ():
                        text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                        finish = choice.get("finish_reason") or finish
                        if text:
                            now = time.perf_counter()
                            first = first if first is not None else now
                            last = now
                            chunks += 1
                            parts.append(text)
                            yield Chunk(text, now)
        except httpx.HTTPError as exc:
            raise RemoteError(f"{self.endpoint.url}: {type(exc).__name__}: {exc}") from exc
        yield StreamEnd("".join(parts), finish, started, first, last, chunks, usage, timings, metrics)


def _error_text(body: dict) -> str:
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error or body)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    try:
        message = _error_text(response.json())
    except ValueError:
        message = response.text[:200]
    hint = " (check the API key)" if response.status_code == 401 else ""
    raise RemoteError(f"{response.request.url} answered {response.status_code}: {message}{hint}")
