"""A growing chat on the real default pair (slow): a pasted module, then follow-ups. The first
turn shows the prompt's progress while it is read; each later turn reuses the conversation's
cache (its reply's stats say how much was kept) and the window stays responsive. Prints the
turns' figures and the worst GUI stall (app/shell/stall.py); the goal is < 50 ms."""
import json

import pytest
from PySide6.QtCore import QTimer

from engine.core.paths import RESOURCES

pytestmark = pytest.mark.slow


def test_a_growing_chat_reads_only_what_each_turn_adds(qtbot, real_pair_window, capsys, tmp_path):
    window = real_pair_window
    turns = json.loads((RESOURCES / "prompts" / "conversation.json").read_text())["turns"]
    progress: list[str] = []

    def watch() -> None:
        text = window.chat.stats.text()
        if text.startswith("reading the prompt") and text not in progress:
            if not progress:  # what a person sees while a pasted file is read
                kept = window.stalls.worst_ms
                window.grab().save(str(tmp_path / "chat-reading-the-prompt.png"))
                # The screenshot is this test's own stall (a PNG encoded on the GUI thread), not the app's.
                window.stalls.reset()
                window.stalls.worst_ms = kept
            progress.append(text)

    timer = QTimer()
    timer.timeout.connect(watch)
    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    chat.panel.max_new_tokens.setValue(32)
    timer.start(5)
    stalls = []
    try:
        for turn in turns:
            window.stalls.reset()
            chat.input.setPlainText(turn)
            chat.send_button.click()
            qtbot.waitUntil(lambda: not chat.running, timeout=900_000)
            stalls.append(window.stalls.worst_ms)
    finally:
        timer.stop()
    window.grab().save(str(tmp_path / "chat-after-four-turns.png"))
    worst = max(stalls)
    metas = [m["meta"] for m in chat.current.messages if m["role"] == "assistant"]
    assert len(metas) == len(turns) == 4 and all(m["new_tokens"] > 0 for m in metas)
    first = metas[0]
    assert first["prompt_tokens"] > 512 and first["cached_tokens"] < first["prompt_tokens"] // 4
    # Each turn's prompt starts with the last one's: all of it is kept.
    for earlier, later in zip(metas, metas[1:]):
        assert later["cached_tokens"] >= earlier["prompt_tokens"]
    assert progress and all("of" in p and "tokens" in p for p in progress)
    with capsys.disabled():
        print("\n[real pair growing chat] " + "; ".join(
            f"turn {i + 1}: prompt {m['prompt_tokens']} ({m['cached_tokens']} kept), first token {m['ttft_s']:.2f} s,"
            f" {m['new_tokens']} tokens at {m['tok_per_s']:.1f} tok/s" for i, m in enumerate(metas))
            + f"; progress shown {len(progress)} times; worst GUI stall by turn "
            + ", ".join(f"{w:.0f}" for w in stalls) + f" ms; screenshots in {tmp_path}")
    assert worst < 1000  # the goal is < 50 ms; this guards against a freeze on a noisy machine
