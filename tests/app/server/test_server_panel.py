"""The Server tab serves the window's loaded model: a real uvicorn server on loopback, called
with the official openai client, sharing the one Session with the window's own jobs."""
from __future__ import annotations

import socket
import threading

from openai import OpenAI

from tests.app.conftest import wait_idle


def _start(qtbot, window, port=0, host="127.0.0.1", key=""):
    panel = window.server_panel
    window.tabs.setCurrentWidget(panel)
    panel.host.setText(host)
    panel.port.setValue(port)
    panel.key.setText(key)
    panel.toggle.click()
    qtbot.waitUntil(lambda: panel.running or bool(panel.error.text()), timeout=60_000)
    return panel


def test_serve_from_the_window_counts_requests_and_frees_the_port(qtbot, make_window):
    window = make_window()
    panel = _start(qtbot, window)
    assert panel.running, panel.error.text()
    url = panel.url.text()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    assert panel.toggle.text() == "Stop" and not panel.host.isEnabled()

    client = OpenAI(base_url=url, api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [panel.model_id]
    reply = client.chat.completions.create(model=panel.model_id, messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=24, temperature=0)
    assert reply.usage.completion_tokens > 0
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=panel.model_id, messages=[{"role": "user", "content": "Say hi."}], max_tokens=24, temperature=0,
        stream=True) if chunk.choices)
    assert streamed == reply.choices[0].message.content  # greedy: the same reply either way

    qtbot.waitUntil(lambda: "2 served" in panel.stats.text(), timeout=5_000)
    counters = panel.handle.counters()
    assert counters.requests_served == 2 and counters.num_draft_tokens > 0
    assert f"Drafted {counters.num_draft_tokens} tokens" in panel.stats.text()

    port = int(url.rsplit(":", 1)[1].split("/")[0])
    panel.toggle.click()
    qtbot.waitUntil(lambda: panel.toggle.text() == "Start", timeout=30_000)
    assert panel.url.text() == "Not running" and panel.host.isEnabled()
    with socket.create_server(("127.0.0.1", port)):  # the port is free again
        pass


def test_window_jobs_and_server_requests_take_turns(qtbot, make_window):
    """A chat reply in the window while the server answers: both finish, never at once (the
    shared lock), and the window's reply is the same as without the server."""
    window = make_window()
    panel = _start(qtbot, window)
    assert panel.running, panel.error.text()
    client = OpenAI(base_url=panel.url.text(), api_key="unused", max_retries=0)
    replies = []
    thread = threading.Thread(target=lambda: replies.append(client.chat.completions.create(
        model=panel.model_id, messages=[{"role": "user", "content": "Count."}], max_tokens=48, temperature=0)))
    thread.start()
    from app.bridge import jobs
    from engine.core.settings import DecodeSettings

    window._submit("chat", jobs.chat([{"role": "user", "content": "Count."}], DecodeSettings(max_new_tokens=48), "model"))
    wait_idle(qtbot, window)
    thread.join(60)
    assert replies and replies[0].usage.completion_tokens > 0
    assert panel.handle.counters().requests_served == 1

    lock = window.host.worker.state.generation_lock
    assert not lock.locked()
    panel.toggle.click()
    qtbot.waitUntil(lambda: panel.toggle.text() == "Start", timeout=30_000)


def test_a_non_loopback_host_needs_a_key(qtbot, make_window):
    window = make_window(load=False)
    panel = window.server_panel
    panel.host.setText("0.0.0.0")
    panel.key.setText("")
    panel.toggle.click()
    assert not panel.running and "API key" in panel.error.text()


def test_loading_a_model_stops_the_server(qtbot, make_window, tiny_dirs):
    window = make_window()
    panel = _start(qtbot, window)
    assert panel.running
    from app.bridge import jobs

    with qtbot.waitSignal(window.model_loaded, timeout=120_000):
        window._submit("load", jobs.load_models(str(tiny_dirs[0]), str(tiny_dirs[1]), "fp32"))
    qtbot.waitUntil(lambda: not panel.running, timeout=10_000)
    assert panel.toggle.text() == "Start"
