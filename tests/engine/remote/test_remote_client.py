"""The remote client against real ``tandem serve`` servers on loopback (speculation on / off):
model lists, timed streams, per-request timings, /metrics deltas, a race of the two."""
from __future__ import annotations

import pytest

from engine.remote.client import Chunk, RemoteClient, RemoteEndpoint, RemoteError, StreamEnd
from engine.remote.metrics import spec_counters, spec_delta
from engine.remote.race import Lane, LaneChunk, LaneDone, RaceResult, acceptance_of, measured_stream, race
from tests.engine.remote.remote_servers import two_servers  # noqa: F401 (a fixture)

MESSAGES = [{"role": "user", "content": "Count from one to twenty."}]
# The tiny drafter costs as much as the tiny target, so the adaptive draft length soon stops
# drafting: a fixed k keeps every request drafting.
DRAFT = {"speculative": {"draft_length": 3}}


def test_models_and_a_timed_stream(two_servers):
    on, _ = two_servers
    with RemoteClient(RemoteEndpoint(on.url)) as client:
        assert [m.id for m in client.list_models()] == ["tiny-target"]
        items = list(client.stream_chat("tiny-target", MESSAGES, max_tokens=20, temperature=0, **DRAFT))
    chunks, end = [i for i in items if isinstance(i, Chunk)], items[-1]
    assert isinstance(end, StreamEnd) and end.text == "".join(c.text for c in chunks)
    assert end.usage["completion_tokens"] == 20 and end.finish_reason == "length"
    assert [c.at for c in chunks] == sorted(c.at for c in chunks) and end.first_chunk_at >= end.started
    assert end.timings["draft_n"] > 0 and 0 <= end.timings["draft_n_accepted"] <= end.timings["draft_n"]


def test_the_url_may_name_v1_and_a_wrong_key_is_a_clear_error(two_servers):
    from engine.serving.server import ServerConfig, run_in_thread
    from tests.engine.remote.remote_servers import tiny_session

    on, _ = two_servers
    with RemoteClient(RemoteEndpoint(on.url + "/v1")) as client:
        assert client.list_models()[0].id == "tiny-target"
    with run_in_thread(tiny_session(), ServerConfig(port=0, api_key="s3cret")) as locked:
        with RemoteClient(RemoteEndpoint(locked.url, "wrong")) as client, pytest.raises(RemoteError, match="401"):
            client.list_models()
        with RemoteClient(RemoteEndpoint(locked.url, "s3cret")) as client:
            assert client.list_models()[0].id == "tiny-target"
            assert client.metrics_text() is not None  # the key opens /metrics too


def test_metrics_delta_matches_the_request_timings(two_servers):
    """tandem serve exports vLLM's counter names: their growth around a request is what the
    request's own timings say."""
    on, _ = two_servers
    with RemoteClient(RemoteEndpoint(on.url)) as client:
        before = spec_counters(client.metrics_text())
        end = list(client.stream_chat("tiny-target", MESSAGES, max_tokens=24, temperature=0, **DRAFT))[-1]
        after = spec_counters(client.metrics_text())
    delta = spec_delta(before, after)
    assert (delta.draft_tokens, delta.accepted) == (end.timings["draft_n"], end.timings["draft_n_accepted"])
    assert delta.generation_tokens == 24
    # Without the timings (vLLM), the acceptance falls back to the counters.
    no_timings = StreamEnd(end.text, end.finish_reason, end.started, end.first_chunk_at, end.last_chunk_at, end.chunks,
                           end.usage, {}, {})
    by_metrics = acceptance_of(no_timings, before, after)
    assert by_metrics.source == "metrics" and by_metrics.drafted == end.timings["draft_n"]
    assert acceptance_of(no_timings, None, None).source == "not reported"


def test_measured_stream_reports_speed_and_acceptance(two_servers):
    on, off = two_servers
    runs = {}
    for name, handle in (("on", on), ("off", off)):
        with RemoteClient(RemoteEndpoint(handle.url)) as client:
            extra = DRAFT if name == "on" else {}
            runs[name] = list(measured_stream(client, name, "tiny-target", MESSAGES, max_tokens=24, temperature=0,
                                              **extra))[-1]
    assert runs["on"].new_tokens == runs["off"].new_tokens == 24
    assert runs["on"].tok_per_s > 0 and runs["off"].tok_per_s > 0
    assert runs["on"].acceptance.source == "timings" and runs["on"].acceptance.drafted > 0
    assert runs["off"].acceptance.drafted == 0  # plain decoding drafts nothing
    assert runs["on"].text == runs["off"].text  # lossless under greedy decoding


def test_race_streams_both_and_compares_outputs(two_servers):
    on, off = two_servers
    with RemoteClient(RemoteEndpoint(on.url)) as a, RemoteClient(RemoteEndpoint(off.url)) as b:
        events = list(race([Lane("speculative", a, "tiny-target", tuple(DRAFT.items())), Lane("plain", b, "tiny-target")], MESSAGES,
                           max_tokens=32))
    result = events[-1]
    assert isinstance(result, RaceResult) and result.identical
    assert {e.lane for e in events if isinstance(e, LaneChunk)} == {0, 1}
    assert sum(isinstance(e, LaneDone) for e in events) == 2
    assert result.runs[0].acceptance.drafted > 0 and result.speedup is not None


def test_an_unreachable_endpoint_is_a_lane_error_not_a_crash():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with RemoteClient(RemoteEndpoint(f"http://127.0.0.1:{port}")) as client:
        run = list(measured_stream(client, "gone", "m", MESSAGES, max_tokens=4))[-1]
    assert run.error and "127.0.0.1" in run.error and run.text == ""
