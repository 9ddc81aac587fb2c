"""The chat on the real default pair (slow): a long Markdown reply with code streams while the
window stays responsive. Prints the worst GUI stall (app/stall.py); the goal is < 50 ms."""
import pytest

from tests.app.conftest import wait_idle

pytestmark = pytest.mark.slow

PROMPT = ("Write a Python module with three functions (is_prime, primes_below, nth_prime), each in its own "
          "fenced code block, and a Markdown table comparing their running times.")


def test_a_long_markdown_reply_streams_without_freezing(qtbot, app_settings, capsys):
    from engine.models import default_pair

    if default_pair.installed_paths() is None:
        pytest.fail("the default pair is not installed: run the set-up (make setup) first")
    from app.window import MainWindow

    window = MainWindow(app_settings, autoload=True)
    qtbot.addWidget(window)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.loaded is not None, timeout=600_000)
        # The local-model scan follows the first load (once); the stall measured is streaming's.
        qtbot.waitUntil(lambda: window.models.local_listed, timeout=60_000)
        wait_idle(qtbot, window, timeout=600_000)
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
    finally:
        window.close()
