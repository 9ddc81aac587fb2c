"""uvicorn's h11 protocol with a deadline for reading each request.

uvicorn bounds the idle time between requests (``timeout_keep_alive``) and, with
``limit_concurrency``, answers 503 past a number of connections, but it waits for a request's
headers and body as long as the client takes: a client that sends a byte now and then holds a
connection (a file descriptor, and a place under the cap) for ever. Here a request's headers
must arrive within ``read_timeout`` seconds of the connection opening (or of the previous
response on a kept-alive connection), and its body within ``read_timeout`` seconds more; a
client that misses either is disconnected. Replies are not timed: a long stream is fine.
"""
from __future__ import annotations

import asyncio
import functools
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class DeadlineH11Protocol(H11Protocol):
    """The phase of the request being read follows h11's view of the client: IDLE (its headers
    are awaited), SEND_BODY (its body is); the deadline restarts only when the phase changes,
    so bytes that trickle in never extend it."""

    def __init__(self, *args, read_timeout: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout
        self._reading: object = None  # h11.IDLE, h11.SEND_BODY or None (not reading a request)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._follow_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # a kept-alive connection starts its next request here
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def _follow_request(self) -> None:
        state = self.conn.their_state
        reading = state if state in (h11.IDLE, h11.SEND_BODY) else None
        if reading is self._reading:
            return
        self._cancel_deadline()
        self._reading = reading
        if reading is not None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.read_timeout, self._expire)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            what = "headers" if self._reading is h11.IDLE else "body"
            log.debug("closing a connection whose request %s took over %s s", what, self.read_timeout)
            self.transport.close()  # a route still reading the body sees the client gone


def with_read_timeout(read_timeout: float):
    """The protocol factory for ``uvicorn.Config(http=...)``."""
    return functools.partial(DeadlineH11Protocol, read_timeout=read_timeout)
