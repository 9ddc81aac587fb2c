"""One engine thread behind many clients: arrival order, 429 when the queue is full, nothing lost
or hung, and a client that disconnects frees the engine at its next step."""
import json
import threading
import time

from tests.engine.serving.client import assert_error, chat, connect

CLIENTS = 16
REQUESTS_EACH = 3
MAX_TOKENS = 6


def _client(url, index, results):
    for j in range(REQUESTS_EACH):
        stream = (index + j) % 2 == 0
        reply = chat(url, f"Client {index} asks {j}", temperature=0, max_tokens=MAX_TOKENS, stream=stream)
        results.append((stream, reply))


def _run_clients(url):
    results: list = []
    threads = [threading.Thread(target=_client, args=(url, i, results)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)  # a hang fails the test below instead of blocking the suite
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert len(results) == CLIENTS * REQUESTS_EACH, "a request was lost"
    return results


def _assert_complete(stream, reply):
    """The answer is whole: MAX_TOKENS tokens (the endless session never stops early)."""
    assert reply.status == 200, reply.body
    if stream:
        data = reply.sse_data()
        assert data[-1] == "[DONE]"
        finish = json.loads(data[-2])
        assert finish["choices"][0]["finish_reason"] == "length"
        assert finish["timings"]["predicted_n"] == MAX_TOKENS
    else:
        body = reply.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == MAX_TOKENS


def test_16_clients_each_get_complete_answers_when_the_queue_holds_them_all(endless_session, start_server):
    # 16 clients with one request each outstanding never exceed 1 running + 15 queued.
    handle = start_server(endless_session, queue_size=CLIENTS)
    results = _run_clients(handle.url)
    for stream, reply in results:
        _assert_complete(stream, reply)
    counters = handle.counters()
    assert counters.requests_served == CLIENTS * REQUESTS_EACH
    assert counters.requests_rejected == 0 and counters.in_flight == 0 and counters.queue_depth == 0
    assert counters.generation_tokens == CLIENTS * REQUESTS_EACH * MAX_TOKENS


def test_16_clients_on_a_short_queue_are_answered_or_refused_with_429(endless_session, start_server):
    handle = start_server(endless_session, queue_size=2)
    results = _run_clients(handle.url)
    refused = 0
    for stream, reply in results:
        if reply.status == 429:
            refused += 1
            error = assert_error(reply, 429)
            assert error["code"] == "queue_full" and int(reply.headers["retry-after"]) >= 1
        else:
            _assert_complete(stream, reply)
    counters = handle.counters()
    assert refused > 0, "a queue of 2 behind one engine must refuse some of 16 clients"
    assert counters.requests_rejected == refused
    assert counters.requests_served == len(results) - refused
    assert counters.in_flight == 0


def _open_stream(url, max_tokens):
    """Start a long streamed chat; returns (connection, response) after its first text chunk."""
    conn = connect(url, timeout=30)
    body = {"messages": [{"role": "user", "content": "Go on forever."}], "temperature": 0, "max_tokens": max_tokens,
            "stream": True, "speculative": {"enabled": False}}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    seen = 0
    while seen < 3:  # the role chunk and two text chunks: it is decoding now
        line = response.fp.readline()
        assert line, "the stream ended early"
        seen += line.startswith(b"data: ")
    return conn, response


def _wait_until(predicate, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_client_that_drops_a_stream_frees_the_engine_for_the_next(endless_session, start_server):
    handle = start_server(endless_session)
    conn, response = _open_stream(handle.url, max_tokens=3000)  # ~30 s of decoding if nobody cancelled it
    conn.sock.close()  # the client dies mid-stream
    response.close()
    _wait_until(lambda: handle.counters().requests_cancelled == 1)
    cancelled_at = handle.counters().generation_tokens
    assert cancelled_at < 3000
    reply = chat(handle.url, temperature=0, max_tokens=4)
    assert reply.status == 200 and reply.json()["usage"]["completion_tokens"] == 4
    counters = handle.counters()
    assert counters.generation_tokens == cancelled_at + 4  # the dropped request decoded nothing more
    assert counters.requests_served == 1 and counters.in_flight == 0


def test_queue_full_answers_429_and_a_dropped_queued_request_is_skipped(endless_session, start_server):
    handle = start_server(endless_session, queue_size=1)
    running_conn, running = _open_stream(handle.url, max_tokens=3000)
    # A non-streamed request waits in the queue; its client gives up.
    queued = connect(handle.url, timeout=30)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    queued.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    _wait_until(lambda: handle.counters().queue_depth == 1)
    refused = chat(handle.url, max_tokens=5)
    error = assert_error(refused, 429)
    assert error["type"] == "rate_limit_error" and refused.headers["retry-after"].isdigit()
    queued.sock.close()
    running_conn.sock.close()
    running.close()
    _wait_until(lambda: handle.counters().requests_cancelled == 2 and handle.counters().in_flight == 0)
    counters = handle.counters()
    assert counters.requests_rejected == 1 and counters.requests_served == 0
    assert chat(handle.url, temperature=0, max_tokens=2).status == 200
