"""End to end on the real default pair (slow): the app finds the bundled models without a
network, loads them on its worker, runs the side-by-side demo and a chat turn, and stays
responsive while it does."""
import pytest

from tests.app.conftest import wait_idle

pytestmark = pytest.mark.slow


def test_default_pair_demo_and_chat(qtbot, app_settings, capsys):
    from engine.models.loading import default_pair

    if default_pair.installed_paths() is None:
        pytest.fail("the default pair is not installed: run the set-up (make setup) first")
    from app.shell.window import MainWindow

    window = MainWindow(app_settings, autoload=True)  # finds and loads the bundled pair itself
    qtbot.addWidget(window)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.loaded is not None, timeout=600_000)
        wait_idle(qtbot, window, timeout=600_000)
        assert "Qwen2.5-Coder-1.5B" in window.model_label.text() or "1.5b" in window.model_label.text().lower()
        # By default the pair runs from its GGUF file, and the precision combo says so first.
        assert window.loaded.precision == "file" and window.loaded.target_path.endswith(".gguf")
        combo = window.demo.controls.precision
        assert combo.itemText(0) == "As in the file (Q4_K_M)" and combo.currentData() == "file"
        assert combo.itemText(combo.findData("int4")) == "int4 (re-quantized from Q4_K_M)"
        window.demo.controls.max_new_tokens.setValue(48)
        window.demo.controls.draft_length.setValue(4)  # fixed k: drafting must not hinge on noisy timings
        window.demo.prompt.setPlainText("Write a Python function is_prime(n) with a docstring.")
        # The local-model scan follows the first load on the worker (its first imports hold the
        # GIL for tens of ms, once); what is measured here is the stall while a demo streams.
        qtbot.waitUntil(lambda: window.models.local_listed, timeout=60_000)
        wait_idle(qtbot, window)
        window.stalls.reset()
        with qtbot.waitSignal(window.demo_finished, timeout=600_000) as finished:
            window.demo.run_button.click()
        worst_demo = window.stalls.worst_ms
        result = finished.args[0]
        assert result.plain.stats.new_tokens == 48 and result.speculative.stats.accepted > 10
        assert "def" in window.demo.panes["plain"].toPlainText()
        wait_idle(qtbot, window)

        window.stalls.reset()
        window.chat.input.setPlainText("Say hello in five words.")
        window.chat.send_button.click()
        qtbot.waitUntil(lambda: not window.chat.running, timeout=600_000)
        worst_chat = window.stalls.worst_ms
        assert window.chat.current.messages[-1]["role"] == "assistant"
        with capsys.disabled():
            print(f"\n[real pair] demo speedup {result.speedup:.2f}x identical={result.identical}; "
                  f"worst GUI stall: demo {worst_demo:.0f} ms, chat {worst_chat:.0f} ms")
        # The target is < 50 ms; a freeze (seconds) is what this guards against on a noisy box.
        assert worst_demo < 1000 and worst_chat < 1000
    finally:
        window.close()
