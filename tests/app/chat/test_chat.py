"""Chat in a real window on tiny models: streaming, stop, regenerate, history across restarts."""
import json

from tests.app.conftest import wait_idle


def send(qtbot, window, text):
    window.chat.input.setPlainText(text)
    window.chat.send_button.click()
    qtbot.waitUntil(lambda: not window.chat.running, timeout=120_000)
    wait_idle(qtbot, window)


def test_reply_streams_and_history_survives_a_restart(qtbot, make_window, app_settings):
    window = make_window()
    window.tabs.setCurrentIndex(2)
    window.chat.panel.max_new_tokens.setValue(24)
    chunks = []
    window.host.event.connect(lambda e: e.kind == "chat" and chunks.append(e.payload))
    send(qtbot, window, "write add(a, b)")
    conversation = window.chat.current
    assert [m["role"] for m in conversation.messages] == ["user", "assistant"]
    reply = conversation.messages[-1]
    assert reply["content"] and "tok/s" in reply["stats"]
    assert sum(1 for c in chunks if type(getattr(c, "event", None)).__name__ == "Tokens") >= 2  # it streamed
    assert reply["content"] in window.chat.transcript.toPlainText().replace("\u2029", "\n") or reply["content"][:10] in window.chat.transcript.toPlainText()
    send(qtbot, window, "and subtract?")
    assert len(conversation.messages) == 4
    window.close()

    again = make_window(settings=app_settings)
    restored = again.chat.conversations[0]
    assert restored.id == conversation.id
    assert [m["content"] for m in restored.messages] == [m["content"] for m in conversation.messages]
    assert again.chat.list.item(0).text() == "write add(a, b)"


def test_regenerate_replaces_the_last_reply(qtbot, make_window):
    window = make_window()
    window.chat.panel.max_new_tokens.setValue(16)
    window.chat.panel.temperature.setValue(0.8)  # above 0: sampled
    send(qtbot, window, "hello there")
    assert window.chat.regenerate_button.isEnabled()
    window.chat.regenerate_button.click()
    qtbot.waitUntil(lambda: not window.chat.running, timeout=120_000)
    roles = [m["role"] for m in window.chat.current.messages]
    assert roles == ["user", "assistant"]


def test_stop_keeps_the_partial_reply_and_the_question(qtbot, make_window):
    window = make_window()
    window.chat.panel.max_new_tokens.setValue(4000)
    window.chat.input.setPlainText("tell me a long story")
    window.chat.send_button.click()
    qtbot.waitUntil(lambda: window.chat.streaming and len(window.chat.streaming["content"]) > 5, timeout=60_000)
    window.chat.stop_button.click()
    qtbot.waitUntil(lambda: not window.chat.running, timeout=60_000)
    messages = window.chat.current.messages
    assert messages[0]["content"] == "tell me a long story"
    assert messages[-1]["role"] == "assistant" and "stopped" in messages[-1]["stats"]
    saved = json.loads(window.chat.store.path(window.chat.current.id).read_text())
    assert saved["messages"] == messages


def test_sending_without_a_model_keeps_the_text(qtbot, make_window):
    window = make_window(load=False)
    window.chat.input.setPlainText("are you there?")
    assert not window.chat.send_button.isEnabled()
    window.chat.send()
    assert window.chat.input.toPlainText() == "are you there?"
    assert window.chat.current.messages == []


def test_a_replys_code_keeps_its_indentation(qtbot, make_window):
    """The transcript is HTML, which collapses runs of spaces: a Python reply lost its indents."""
    window = make_window(load=False)
    conversation = window.chat.current
    conversation.messages.append({"role": "user", "content": "write f"})
    conversation.messages.append({"role": "assistant", "content": "def f():\n    if x:\n        return 1", "stats": ""})
    window.chat.render()
    shown = window.chat.transcript.toPlainText().replace("\u2029", "\n")
    assert "def f():\n    if x:\n        return 1" in shown
