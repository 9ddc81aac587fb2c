"""Remote models on the Models tab and chat against one: a real `tandem serve` on loopback."""
from __future__ import annotations

from tests.app.conftest import wait_idle
from tests.engine.remote.remote_servers import two_servers  # noqa: F401 (a fixture)


def test_add_a_remote_server_use_its_model_and_chat(qtbot, make_window, two_servers):
    on, _ = two_servers
    window = make_window(load=False)
    box = window.remote_models
    box.add_server(on.url + "/v1")
    qtbot.waitUntil(lambda: box.table.rowCount() == 1, timeout=15_000)
    assert box.rows() == [("tiny-target", "remote", "on the server", on.url + "/v1")]

    with qtbot.waitSignal(window.model_loaded, timeout=30_000) as loaded:
        box.table.cellWidget(0, 4).click()
    assert loaded.args[0].precision == "remote" and loaded.args[0].target == "tiny-target"
    wait_idle(qtbot, window)
    assert "on the server" in window.model_label.text()

    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    served_before = on.counters().requests_served
    chat.input.setPlainText("Count.")
    chat.send_button.click()
    qtbot.waitUntil(lambda: not chat.running, timeout=60_000)
    reply = chat.current.messages[-1]
    assert reply["role"] == "assistant" and reply["content"]
    assert on.counters().requests_served == served_before + 1  # the server answered it
    assert reply["meta"]["model"] == "tiny-target" and reply["meta"]["precision"] == "remote"


def test_a_server_that_is_down_says_so(qtbot, make_window):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    window = make_window(load=False)
    box = window.remote_models
    box.add_server(f"http://127.0.0.1:{port}")
    qtbot.waitUntil(lambda: "cannot be reached" in box.status.text(), timeout=15_000)
    assert box.table.rowCount() == 0
