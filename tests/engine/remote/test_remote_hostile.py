"""The remote client against a hostile "vLLM" on loopback (tests/engine/remote/hostile_remote.py):
endless or compressed-endless bodies, a stream without newlines, a stream past max_tokens, drips
that never end, malformed JSON, terminal escapes in what the CLI prints.

The memory cases run the call in a process of its own (tests/engine/remote/remote_probe.py) and bound
its growth far below the server's 300 MB budget; every hostile reply also ends at that budget or
after 30 s, so a client without its limits fails these tests instead of filling the machine.
The deadline cases give the client a 1 s timeout and assert the error it raised, not a duration.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from engine.cli import main
from engine.remote.client import KB, Limits, RemoteClient, RemoteEndpoint, RemoteError, StreamEnd
from tests.engine.remote.hostile_remote import hostile
from tests.paths import REPO_ROOT as ROOT

MESSAGES = [{"role": "user", "content": "hi"}]
GROWTH_MB = 200  # a capped read costs tens of MB; an uncapped one the whole 300 MB budget, twice over
TERMINAL_CONTROLS = set("\x1b\x07\x9b\r")  # ESC, BEL, CSI (C1), carriage return


def probe(url: str, call: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.engine.remote.remote_probe", url, call], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def the_error(result: dict, url: str) -> str:
    assert result["error"] is not None, result
    assert result["error"]["type"] == "RemoteError", result
    assert url in result["error"]["text"], result
    return result["error"]["text"]


# -- bytes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("behaviour, call, limit, endless", [
    ("endless_models", "models", "4 MB", True),
    ("gzip_bomb_models", "models", "4 MB", False),  # ~300 kB on the wire: the socket buffers take it all
    ("huge_metrics", "metrics", "8 MB", True),
    ("no_newline_stream", "stream", "1 MB", True),
])
def test_an_endless_reply_is_cut_at_its_limit(behaviour, call, limit, endless):
    with hostile(behaviour) as server:
        result = probe(server.url, call)
        assert not endless or server.hung_up.wait(10)  # the client hung up; the budget did not end it
    assert limit in the_error(result, server.url)
    assert result["growth_mb"] < GROWTH_MB, result


@pytest.mark.parametrize("call", ["models", "stream"])
def test_an_endless_error_body_is_cut_to_its_first_kilobytes(call):
    with hostile("endless_error") as server:
        result = probe(server.url, call)
        assert server.hung_up.wait(10)
    text = the_error(result, server.url)
    assert "500" in text and "Internal Server Error" in text
    assert result["growth_mb"] < 50, result


def test_a_stream_past_max_tokens_is_stopped_there():
    with hostile("endless_tokens") as server:
        result = probe(server.url, "stream")
        assert server.hung_up.wait(10)
    assert "max_tokens=16" in the_error(result, server.url)
    assert result["chunks"] == 16 and result["growth_mb"] < 50, result


def test_a_body_announced_over_its_limit_is_not_read():
    with hostile("huge_length_models") as server, RemoteClient(RemoteEndpoint(server.url)) as client:
        with pytest.raises(RemoteError, match="announced 1,000,000 MB for a model list, over the limit of 4 MB"):
            client.list_models()
        assert server.hung_up.wait(10)


def test_a_stream_without_max_tokens_is_cut_at_its_byte_limit():
    with hostile("endless_tokens") as server, \
            RemoteClient(RemoteEndpoint(server.url), limits=Limits(stream_bytes=100 * KB)) as client:
        with pytest.raises(RemoteError, match="more than 100 kB in one stream"):
            list(client.stream_chat("m", MESSAGES))
        assert server.hung_up.wait(10)


# -- time ---------------------------------------------------------------------------------------
def test_a_dripping_model_list_ends_at_the_deadline():
    with hostile("drip_models") as server, RemoteClient(RemoteEndpoint(server.url), timeout_s=1.0) as client:
        with pytest.raises(RemoteError, match="longer than 1 s") as caught:
            client.list_models()
        assert server.hung_up.wait(10)
    assert server.url in str(caught.value)


def test_keep_alives_without_text_end_at_the_progress_timeout():
    with hostile("drip_keepalive_stream") as server, RemoteClient(RemoteEndpoint(server.url), timeout_s=1.0) as client:
        with pytest.raises(RemoteError, match="no text for 1 s") as caught:
            list(client.stream_chat("m", MESSAGES, max_tokens=4))
        assert server.hung_up.wait(10)
    assert server.url in str(caught.value)


def test_slow_tokens_are_progress():
    """Ten tokens 0.2 s apart, against a 1 s timeout: every token restarts the wait."""
    with hostile("slow_tokens") as server, RemoteClient(RemoteEndpoint(server.url), timeout_s=1.0) as client:
        end = list(client.stream_chat("m", MESSAGES, max_tokens=16))[-1]
    assert isinstance(end, StreamEnd) and end.chunks == 10 and end.text == "tok " * 10


# -- malformed replies --------------------------------------------------------------------------
@pytest.mark.parametrize("behaviour, call", [
    ("garbage_stream", "stream"), ("scalar_stream", "stream"), ("nested_models", "models"), ("scalar_models", "models"),
])
def test_a_malformed_reply_is_a_remote_error_naming_the_server(behaviour, call):
    with hostile(behaviour) as server, RemoteClient(RemoteEndpoint(server.url)) as client:
        with pytest.raises(RemoteError, match=re.escape(server.url)):
            if call == "models":
                client.list_models()
            else:
                list(client.stream_chat("m", MESSAGES, max_tokens=4))


def test_absurd_metrics_give_no_acceptance_and_no_error():
    """A per-position counter at position 100 million and counters at +Inf / NaN: the run is
    measured from its stream, its acceptance is not reported."""
    from engine.remote.race import measured_stream

    with hostile("metrics_label_bomb") as server, RemoteClient(RemoteEndpoint(server.url)) as client:
        run = list(measured_stream(client, "bomb", "m", MESSAGES, max_tokens=4))[-1]
    assert run.error is None and run.new_tokens == 4
    assert not run.acceptance.drafted


def test_counts_that_are_not_numbers_are_not_used():
    from engine.remote.race import measured_stream

    with hostile("junk_counts_stream") as server, RemoteClient(RemoteEndpoint(server.url)) as client:
        run = list(measured_stream(client, "junk", "m", MESSAGES, max_tokens=8))[-1]
    assert run.error is None and run.new_tokens == 4 and run.acceptance.source == "not reported"


# -- what reaches the terminal ------------------------------------------------------------------
def test_escapes_in_an_error_body_are_neutralised():
    with hostile("escape_error") as server, RemoteClient(RemoteEndpoint(server.url)) as client:
        with pytest.raises(RemoteError) as caught:
            client.list_models()
    message = str(caught.value)
    assert "boom" in message and "done" in message and server.url in message
    assert not set(message) & (TERMINAL_CONTROLS | {"\n"}), repr(message)


def test_the_cli_neutralises_a_model_name_and_an_error(capsys):
    with hostile("escape_models_and_text") as server:
        assert main(["models", "--remote", server.url]) == 0
    out = capsys.readouterr().out
    assert "evil" in out and "model" in out
    assert not set(out) & TERMINAL_CONTROLS, repr(out)
    with hostile("escape_error") as server:
        assert main(["models", "--remote", server.url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tandem: error: ") and "boom" in err
    assert not set(err) & TERMINAL_CONTROLS, repr(err)


def test_the_cli_neutralises_streamed_text_and_keeps_its_lines(capsys):
    with hostile("escape_models_and_text") as server:
        main(["compare", "--remote", server.url, "--max-new-tokens", "16", "hi"])
    out = capsys.readouterr().out
    assert "line one\n\tindented" in out and " end" in out
    assert not set(out) & TERMINAL_CONTROLS, repr(out)


def test_an_error_without_a_message_still_says_what_happened(monkeypatch, capsys):
    import engine.cli.remote as remote_cli

    def out_of_memory(args):
        raise MemoryError

    monkeypatch.setattr(remote_cli, "run_remote_models", out_of_memory)
    assert main(["models", "--remote", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tandem: error: ") and "out of memory" in err and "MemoryError" in err


def test_printable_escapes_controls_and_keeps_lines():
    from engine.remote.text import clipped, printable

    assert printable("a\x1b[2Jb\x07\x9bc\u202ed\ud800") == "a\\x1b[2Jb\\x07\\x9bc\\u202ed\\ud800"
    assert printable("one\r\n\ttwo\rthree") == "one\n\ttwo\\x0dthree"
    assert printable("one\ntwo", one_line=True) == "one\\x0atwo"
    assert printable("naïve café 日本語 🙂") == "naïve café 日本語 🙂"
    assert clipped("x" * 500, 10) == "x" * 10 + "..."
