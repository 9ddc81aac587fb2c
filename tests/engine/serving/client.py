"""A small stdlib HTTP client for the server tests: it can send any bytes (invalid JSON
included), read an event stream, and drop a connection mid-stream."""
from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def sse_data(self) -> list[str]:
        """The ``data:`` payloads of an event stream, in order."""
        lines = self.body.decode().splitlines()
        return [line[len("data: "):] for line in lines if line.startswith("data: ")]


def connect(url: str, timeout: float = 60.0) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def call(url: str, method: str, path: str, body=None, headers: dict | None = None, timeout: float = 60.0) -> Reply:
    """One request on its own connection. ``body``: a dict (sent as JSON) or raw bytes."""
    conn = connect(url, timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=all_headers)
        response = conn.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def chat(url: str, content: str = "Say hi.", headers: dict | None = None, **fields) -> Reply:
    return call(url, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": content}], **fields},
                headers=headers)


def assert_error(reply: Reply, status: int, param: str | None = "<any>") -> dict:
    """The reply has ``status`` and OpenAI's error body; returns the error object."""
    assert reply.status == status, (reply.status, reply.body)
    body = reply.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if param != "<any>":
        assert error["param"] == param, error
    return error
