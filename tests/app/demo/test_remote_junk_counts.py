"""A chat against a remote server whose reply reports counts that are not numbers: the reply
is shown and the counts are taken as unreported, not a failed job."""
from __future__ import annotations

from tests.app.conftest import wait_idle
from tests.engine.remote.hostile_remote import hostile, junk_counts_stream


def _models_then_junk(reply, path: str) -> None:
    if path.endswith("/models"):
        reply.head(200)
        reply.write(b'{"object": "list", "data": [{"id": "junk-model", "object": "model", "owned_by": "x"}]}')
        return
    junk_counts_stream(reply, path)


def test_a_reply_with_junk_counts_is_shown_and_counts_nothing(qtbot, make_window):
    with hostile(_models_then_junk) as server:
        window = make_window(load=False)
        box = window.remote_models
        box.add_server(server.url + "/v1")
        qtbot.waitUntil(lambda: box.table.rowCount() == 1, timeout=15_000)
        with qtbot.waitSignal(window.model_loaded, timeout=30_000):
            box.table.cellWidget(0, 4).click()
        wait_idle(qtbot, window)
        chat = window.chat
        window.tabs.setCurrentWidget(chat)
        chat.input.setPlainText("Count.")
        chat.send_button.click()
        qtbot.waitUntil(lambda: not chat.running, timeout=60_000)
        reply = chat.current.messages[-1]
        assert reply["role"] == "assistant"
        assert reply["content"] == "tok tok tok tok "
        assert reply["meta"]["model"] == "junk-model"
