"""The chat on the real default pair (slow): a long Markdown reply with code streams while the
window stays responsive. Prints the worst GUI stall (app/shell/stall.py); the goal is < 50 ms."""
import pytest

pytestmark = pytest.mark.slow

PROMPT = ("Write a Python module with three functions (is_prime, primes_below, nth_prime), each in its own "
          "fenced code block, and a Markdown table comparing their running times.")


def test_a_long_markdown_reply_streams_without_freezing(qtbot, real_pair_window, capsys):
    window = real_pair_window
    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    chat.panel.preset.setCurrentIndex(chat.panel.preset.findText("Coding"))
    chat.panel.preset.activated.emit(chat.panel.preset.currentIndex())
    chat.panel.max_new_tokens.setValue(400)
    chat.input.setPlainText(PROMPT)
    window.stalls.reset()
    chat.send_button.click()
    qtbot.waitUntil(lambda: not chat.running, timeout=900_000)
    worst = window.stalls.worst_ms
    reply = chat.current.messages[-1]
    assert reply["role"] == "assistant" and reply["meta"]["new_tokens"] > 100
    with capsys.disabled():
        print(f"\n[real pair chat] {reply['meta']['new_tokens']} tokens at {reply['meta']['tok_per_s']:.1f} tok/s, "
              f"{reply['content'].count('```') // 2} code blocks; worst GUI stall {worst:.0f} ms")
    assert worst < 1000  # the goal is < 50 ms; this guards against a freeze on a noisy machine
