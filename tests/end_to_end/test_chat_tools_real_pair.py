"""A chat turn that calls an MCP server's tool, on the real default pair and a real stdio MCP
server, in the real window (slow): the call is shown and confirmed in a dialog, runs, its result
is shown and read by the model, which replies from it; declined, the model is told so. Saves a
screenshot of the chat with an attached file and the tool call."""
import shlex
import sys
from pathlib import Path

import pytest

from app.store.tool_settings import McpEntry, ToolSettings
from tests.app.conftest import wait_idle
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.slow
SERVER = f"{shlex.quote(sys.executable)} -m tests.engine.tools.mcp_server --only weather"


def _ask_and_answer(qtbot, chat, run: bool, shot: Path | None = None) -> str:
    """Wait for the confirmation, answer it; the dialog's text."""
    qtbot.waitUntil(lambda: chat.confirm_box is not None and chat.confirm_box.isVisible(), timeout=600_000)
    text = chat.confirm_box.text()
    if shot is not None:
        chat.confirm_box.grab().save(str(shot))
    (chat.run_tool_button if run else chat.decline_tool_button).click()
    return text


def test_a_tool_call_is_confirmed_run_shown_and_answered_from(qtbot, real_pair_window, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the test server is a module of this checkout
    window = real_pair_window
    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    chat._tools_saved(ToolSettings((McpEntry("weather", SERVER),)))
    assert chat.tools_button.text() == "Tools (1)"
    chat.panel.temperature.setValue(0.0)
    chat.panel.max_new_tokens.setValue(80)
    trip = tmp_path / "trip.txt"
    trip.write_text("Friday: fly to Lisbon, 9:40. Pack: sunglasses, charger, passport.\n", encoding="utf-8")
    chat.attach_files([str(trip)])
    qtbot.waitUntil(lambda: all(a is not None and a.tokens for a in chat.attached.values()), timeout=120_000)
    chat.input.setPlainText("What is the weather in Lisbon right now? Use the weather tool.")
    chat.send_button.click()

    asked = _ask_and_answer(qtbot, chat, run=True, shot=tmp_path / "tool-call-confirmation.png")
    assert "weather" in asked and "Lisbon" in asked
    # Asked once: a repeated call (the 1.5B model makes one) is answered from the first result.
    qtbot.waitUntil(lambda: not chat.running or chat.confirm_box is not None, timeout=900_000)
    assert chat.confirm_box is None, "the same call was asked twice"
    wait_idle(qtbot, window, timeout=900_000)
    user, call, result, *rest, reply = chat.current.messages
    assert user["role"] == "user" and user["attachments"][0]["name"] == "trip.txt"
    assert call["role"] == "assistant" and [c["name"] for c in call["tool_calls"]] == ["weather"]
    assert "<tool_call>" not in call["content"]
    assert result["role"] == "tool" and result["outcome"] == "ran" and '"temperature": 21' in result["content"]
    assert all(m.get("tool_calls") == call["tool_calls"] or m == result for m in rest)
    assert reply["role"] == "assistant" and reply["content"] and not reply.get("tool_calls")
    after_call = chat.current.messages[3]  # the reply right after the result read the cache of the call
    assert after_call["meta"]["cached_tokens"] > after_call["meta"]["prompt_tokens"] // 2
    shown = chat.transcript.toPlainText()
    assert "Calls the tool weather" in shown and "Result of weather" in shown and "trip.txt" in shown
    window.resize(1200, 860)
    qtbot.wait(50)
    shot = tmp_path / "chat-with-a-tool-call.png"
    window.grab().save(str(shot))

    chat.regenerate_button.click()  # the same question again, the call declined this time
    _ask_and_answer(qtbot, chat, run=False)
    qtbot.waitUntil(lambda: not chat.running or chat.confirm_box is not None, timeout=900_000)
    assert chat.confirm_box is None, "the declined call was asked again"
    wait_idle(qtbot, window, timeout=900_000)
    roles = [m["role"] for m in chat.current.messages]
    assert roles[:3] == ["user", "assistant", "tool"] and chat.current.messages[2]["outcome"] == "declined"
    assert "Not run (declined): weather" in chat.transcript.toPlainText()
    with capsys.disabled():
        print(f"\n[tool call in the chat] called weather({call['tool_calls'][0]['arguments']}), then: "
              f"{reply['content'][:120]!r} ({after_call['meta']['cached_tokens']} of {after_call['meta']['prompt_tokens']} "
              f"prompt tokens reused after the call; {len(rest)} repeated turns); declined, then: {chat.current.messages[-1]['content'][:100]!r}; "
              f"screenshot {shot}")
