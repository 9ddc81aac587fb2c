"""MTP drafters through the window: a Gemma 4 target with its assistant, and a target that
carries its own MTP layers, loaded and run in the side-by-side demo like any other pair."""

from app.shell.window import UiState
from tests.app.conftest import run_demo, wait_idle


def load(qtbot, window, target, drafter=None):
    from app.bridge import jobs

    with qtbot.waitSignal(window.model_loaded, timeout=180_000) as loaded:
        window._submit("load", jobs.load_models(str(target), str(drafter) if drafter else None, "fp32"))
    wait_idle(qtbot, window)
    return loaded.args[0]


def test_a_gemma4_assistant_drafts_in_the_demo(qtbot, make_window, tmp_path):
    from engine.testing.tiny_gemma4 import save_gemma4_pair

    target, assistant = save_gemma4_pair(tmp_path, "e2b")
    window = make_window(load=False)
    loaded = load(qtbot, window, target, assistant)
    assert loaded.drafter_kind == "model" and loaded.drafter == assistant.name
    assert f"{assistant.name} drafting" in window.model_label.text()
    assert window.demo.controls.drafter_kind() == "model"
    result = run_demo(qtbot, window)
    assert result.identical and result.speculative.stats.accepted > 0
    assert window.state is UiState.IDLE


def test_a_target_with_mtp_layers_switches_the_drafter_to_them(qtbot, make_window, tmp_path):
    from engine.testing.tiny_models import build_tokenizer
    from engine.testing.tiny_mtp import save_tiny_mtp_model

    target = save_tiny_mtp_model(tmp_path / "tiny-glm-mtp", build_tokenizer())
    window = make_window(load=False)
    assert window.demo.controls.drafter_kind() == "model"  # the default choice
    loaded = load(qtbot, window, target)
    assert loaded.drafter_kind == "mtp" and loaded.drafter is None
    assert window.demo.controls.drafter_kind() == "mtp"  # switched: there is no draft model
    assert "MTP layers" in window.model_label.text() and window.drafter_note.isVisibleTo(window)
    combo = window.demo.controls.drafter
    assert not combo.model().item(combo.findData("model")).isEnabled()
    result = run_demo(qtbot, window)
    assert result.identical and result.speculative.stats.drafted > 0


def test_a_pruned_mtp_checkpoint_falls_back_to_lookup_and_says_so(qtbot, make_window, tmp_path):
    from engine.testing.tiny_models import build_tokenizer
    from engine.testing.tiny_mtp import save_tiny_mtp_model

    target = save_tiny_mtp_model(tmp_path / "tiny-glm-pruned", build_tokenizer(), with_mtp=False)
    window = make_window(load=False)
    loaded = load(qtbot, window, target)
    assert loaded.drafter_kind == "lookup"
    assert window.demo.controls.drafter_kind() == "lookup"
    # Asking for MTP anyway: the engine falls back to prompt lookup and the window says why.
    combo = window.demo.controls.drafter
    combo.model().item(combo.findData("mtp")).setEnabled(True)
    combo.setCurrentIndex(combo.findData("mtp"))
    result = run_demo(qtbot, window, "for i in range(10):\n    print(i)\nfor i in range(10):")
    assert result.identical
    assert "no usable MTP drafter" in window.drafter_note.text() and window.drafter_note.isVisibleTo(window)
