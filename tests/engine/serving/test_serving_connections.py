"""Slow or idle clients cannot hold the server's connections: a request's headers, and then its
body, must arrive within ``read_timeout_s``, and connections beyond ``max_connections`` get a
503. Timeouts are set short here; a socket read with a generous timeout detects a connection
the server failed to close (no wall-clock bounds are asserted)."""
import logging
import socket
import threading
import time

import pytest

from tests.engine.serving.client import call, chat, connect

DETECTOR_S = 30.0  # far beyond the configured timeouts: reaching it means the server never closed


def open_socket(handle, first_bytes: bytes) -> socket.socket:
    sock = socket.create_connection((handle.host, handle.port), timeout=DETECTOR_S)
    sock.sendall(first_bytes)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; socket.timeout if it never does."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def drip(sock: socket.socket, piece: bytes, stop: threading.Event) -> threading.Thread:
    """Send ``piece`` every 0.1 s until the server closes: a client that is never idle long."""

    def run() -> None:
        while not stop.wait(0.1):
            try:
                sock.sendall(piece)
            except OSError:
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize("start, piece", [(HEADERS, b"X-Slow: 1\r\n"),
                                          (HEADERS + b"Content-Length: 100000\r\n\r\n{\"messages\": ", b" ")],
                         ids=["headers", "body"])
def test_a_client_that_drips_its_request_is_disconnected(tiny_session, start_server, caplog, start, piece):
    caplog.set_level(logging.WARNING)
    handle = start_server(tiny_session, read_timeout_s=0.5)
    sock, stop = open_socket(handle, start), threading.Event()
    dripping = drip(sock, piece, stop)
    try:
        read_until_closed(sock)  # returns at EOF: the server closed the connection
    finally:
        stop.set()
        dripping.join()
        sock.close()
    assert chat(handle.url, max_tokens=2).status == 200  # the server is fine
    assert handle.counters().requests_served == 1
    assert not [r for r in caplog.records if r.name.startswith("engine.serving") and r.levelno >= logging.ERROR]


def test_a_client_that_sends_half_a_request_and_waits_is_disconnected(tiny_session, start_server):
    handle = start_server(tiny_session, read_timeout_s=0.5)
    for half in (HEADERS, HEADERS + b"Content-Length: 50\r\n\r\n{\"mess"):
        with open_socket(handle, half) as sock:
            read_until_closed(sock)


def test_a_reply_that_takes_longer_than_the_read_timeout_is_not_cut(endless_session, start_server):
    """The deadline covers reading the request only, and every request on a kept-alive
    connection gets its own."""
    handle = start_server(endless_session, read_timeout_s=0.5)
    conn = connect(handle.url, timeout=DETECTOR_S)
    try:
        for _ in range(2):
            conn.request("POST", "/v1/completions", body=b'{"prompt": "a", "max_tokens": 600, "stream": true}',
                         headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            body = reply.read().decode()
            assert reply.status == 200 and body.rstrip().endswith("data: [DONE]")
            time.sleep(0.1)
    finally:
        conn.close()


def test_connections_beyond_the_cap_get_503(tiny_session, start_server):
    cap = 3
    handle = start_server(tiny_session, max_connections=cap, read_timeout_s=DETECTOR_S * 2)
    idle = [open_socket(handle, HEADERS) for _ in range(cap - 1)]
    try:
        assert call(handle.url, "GET", "/health").status == 200  # the cap's last place
        idle.append(open_socket(handle, HEADERS))
        assert call(handle.url, "GET", "/health").status == 503  # one past it
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + DETECTOR_S  # the server notices the closed sockets soon after
    while call(handle.url, "GET", "/health").status != 200:
        assert time.monotonic() < deadline, "the places of closed connections were never freed"
        time.sleep(0.05)


def test_the_limits_must_be_positive():
    from engine.serving.server import ServerConfig

    for fields in ({"read_timeout_s": 0}, {"read_timeout_s": -1.0}, {"max_connections": 0}):
        with pytest.raises(ValueError):
            ServerConfig(**fields).check()


def test_the_cli_refuses_limits_that_are_not_positive_before_loading_anything(capsys):
    from engine.cli import main

    assert main(["serve", "--port", "0", "--read-timeout", "0"]) == 1
    assert "read timeout" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--max-connections", "0"]) == 1
    assert "connection limit" in capsys.readouterr().err
