"""The side-by-side demo in a real window, on tiny models."""

from app.shell.window import UiState
from tests.app.conftest import wait_idle


def test_both_panes_stream_and_stats_update(qtbot, make_window):
    window = make_window()
    demo = window.demo
    demo.prompt.setPlainText("def add(a, b):")
    demo.controls.max_new_tokens.setValue(40)
    seen = {"plain": 0, "speculative": 0}
    window.host.event.connect(lambda e: e.kind == "demo" and hasattr(e.payload, "lane") and seen.__setitem__(e.payload.lane, seen[e.payload.lane] + 1))
    with qtbot.waitSignal(window.demo_finished, timeout=120_000) as finished:
        demo.run_button.click()
        assert window.state is UiState.GENERATING
        assert not demo.run_button.isEnabled() and demo.stop_button.isEnabled()
    result = finished.args[0]
    assert seen["plain"] > 3 and seen["speculative"] > 3
    assert demo.panes["plain"].toPlainText() == result.plain.text
    assert demo.panes["speculative"].toPlainText() == result.speculative.text
    assert result.identical  # fp32 precision
    assert "identical" in demo.values["identical"].text()
    assert demo.values["speedup"].text().endswith("×")
    assert "tok/s" in demo.headers["plain"].rate.text() and "done" in demo.headers["speculative"].rate.text()
    xs, ys = demo.speed_plot.points["speculative"]
    assert len(xs) > 3 and all(y > 0 for y in ys)
    wait_idle(qtbot, window)
    assert window.state is UiState.IDLE and demo.run_button.isEnabled()


def test_drafted_tokens_are_coloured(qtbot, make_window):
    from app.demo.stream_pane import DRAFT_BACKGROUND

    window = make_window()
    window.demo.prompt.setPlainText("for i in range(10):")
    window.demo.controls.max_new_tokens.setValue(40)
    window.demo.controls.draft_length.setValue(3)  # fixed k: drafting regardless of timings
    with qtbot.waitSignal(window.demo_finished, timeout=120_000) as finished:
        window.demo.run_button.click()
    assert finished.args[0].speculative.stats.accepted > 0
    doc = window.demo.panes["speculative"].document()
    block, coloured = doc.begin(), 0
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().background().color() == DRAFT_BACKGROUND:
                coloured += len(fragment.text())
            it += 1
        block = block.next()
    assert coloured > 0


def test_stop_ends_the_run(qtbot, make_window):
    window = make_window()
    window.demo.prompt.setPlainText("hello")
    window.demo.controls.max_new_tokens.setValue(4000)
    with qtbot.waitSignal(window.demo_finished, timeout=120_000) as finished:
        window.demo.run_button.click()
        qtbot.waitUntil(lambda: len(window.demo.panes["plain"].toPlainText()) > 5, timeout=60_000)
        window.demo.stop_button.click()
    result = finished.args[0]
    assert result.plain.reason == "cancelled" and result.speculative.reason == "cancelled"
    wait_idle(qtbot, window)
    assert window.demo.values["identical"].text() == "stopped"


def test_closing_mid_run_stops_the_worker(qtbot, make_window):
    window = make_window()
    window.demo.prompt.setPlainText("hello")
    window.demo.controls.max_new_tokens.setValue(4000)
    window.demo.run_button.click()
    qtbot.waitUntil(lambda: len(window.demo.panes["plain"].toPlainText()) > 5, timeout=60_000)
    window.close()
    assert not window.host.thread.isRunning()


def test_fast_mode_differences_are_explained(qtbot, make_window):
    """bf16 may or may not diverge on a given prompt; when it does, the first differing token is
    marked in both panes with the logit gap. Either way the indicator is truthful."""
    window = make_window(precision="bf16")
    window.demo.controls.max_new_tokens.setValue(60)
    window.demo.prompt.setPlainText("The quick brown fox")
    with qtbot.waitSignal(window.demo_finished, timeout=120_000) as finished:
        window.demo.run_button.click()
    result = finished.args[0]
    label = window.demo.values["identical"]
    if result.identical:
        assert "identical" in label.text()
    else:
        assert f"token {result.divergence.position + 1}" in label.text()
        assert "gap" in label.toolTip()
        assert window.demo.panes["plain"].marked is not None and window.demo.panes["speculative"].marked is not None


def test_errors_show_in_the_window(qtbot, make_window, tmp_path):
    from app.bridge import jobs

    window = make_window(load=False)
    window._submit("load", jobs.load_models(str(tmp_path / "missing"), None, "fp32"))
    wait_idle(qtbot, window)
    assert window.banner.isVisible() and "not a model folder" in window.banner.text.text()
    assert window.state is UiState.ERROR
    assert not window.demo.run_button.isEnabled()  # nothing loaded: nothing to run


def test_settings_survive_a_restart(qtbot, make_window, app_settings):
    window = make_window(load=False)
    window.demo.prompt.setPlainText("my unsent prompt")
    window.chat.input.setPlainText("half a message")
    window.demo.controls.draft_length.setValue(3)
    window.demo.controls.max_new_tokens.setValue(77)
    window.close()
    again = make_window(load=False, settings=app_settings)
    assert again.demo.prompt.toPlainText() == "my unsent prompt"
    assert again.chat.input.toPlainText() == "half a message"
    assert again.demo.controls.draft_length.value() == 3
    assert again.demo.controls.max_new_tokens.value() == 77


def test_choosing_quantized_precision_reloads_an_int8_target_and_stays_identical(qtbot, make_window):
    """The precision combo's int8 entry says it is lossy; choosing it reloads the target with int8
    weights, and speculation on that target still matches its plain decoding token for token."""
    window = make_window()
    combo = window.demo.controls.precision
    index = combo.findData("int8")
    # Named as the engine names it (engine.models.planning.precision_labels); the tooltip says it is lossy.
    assert index >= 0 and combo.itemText(index) == "int8 (quantized by Tandem)" and "slightly" in combo.toolTip()
    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        combo.setCurrentIndex(index)
        combo.activated.emit(index)
    assert loaded.args[0].precision == "int8"
    assert "int8" in window.model_label.text()
    wait_idle(qtbot, window)
    window.demo.prompt.setPlainText("def add(a, b):")
    window.demo.controls.max_new_tokens.setValue(30)
    with qtbot.waitSignal(window.demo_finished, timeout=120_000) as finished:
        window.demo.run_button.click()
    assert finished.args[0].identical
