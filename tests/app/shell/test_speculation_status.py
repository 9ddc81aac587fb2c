"""'Why isn't speculation running?': each cause shows its explanation on the demo and chat tabs,
with tiny real models: plain by choice, no drafter (prompt lookup), a drafter with another
vocabulary (refused), and the draft-length controller switching speculation off."""
import pytest

from tests.app.conftest import wait_idle


def _load(qtbot, window, target, drafter, precision="fp32"):
    from app.bridge import jobs

    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        window._submit("load", jobs.load_models(str(target), str(drafter) if drafter else None, precision))
    wait_idle(qtbot, window)
    return loaded.args[0]


def _shown_on_decoding_tabs(window, words):
    for tab in (window.demo, window.chat):
        window.tabs.setCurrentWidget(tab)
        assert window.speculation.isVisible(), f"no status line on {tab}"
        assert words in window.speculation.text(), window.speculation.text()
    window.tabs.setCurrentWidget(window.models)
    assert not window.speculation.isVisible()  # the picker has its own story


def test_nothing_shown_while_the_draft_model_speculates(make_window):
    window = make_window()
    window.tabs.setCurrentWidget(window.demo)
    assert window.demo.controls.drafter_kind() == "model" and not window.speculation.isVisible()


def test_off_by_choice(make_window):
    window = make_window()
    c = window.demo.controls
    c.drafter.setCurrentIndex(c.drafter.findData("off"))
    _shown_on_decoding_tabs(window, "you chose plain decoding")


def test_no_drafter_means_prompt_lookup(qtbot, make_window, tiny_dirs):
    window = make_window(load=False)
    loaded = _load(qtbot, window, tiny_dirs[0], None)
    assert loaded.drafter_kind == "lookup"
    _shown_on_decoding_tabs(window, "No draft model is loaded")
    assert "download" in window.speculation.text().lower()  # and what to do


@pytest.fixture(scope="module")
def other_vocab_drafter(tmp_path_factory):
    from engine.testing.tiny_models import build_model, build_tokenizer

    tokenizer = build_tokenizer(300)
    path = tmp_path_factory.mktemp("other-vocab") / "tiny-other-vocab"
    build_model(len(tokenizer), seed=3).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_drafter_with_another_vocabulary_is_refused(qtbot, make_window, tiny_dirs, other_vocab_drafter):
    window = make_window(load=False)
    loaded = _load(qtbot, window, tiny_dirs[0], other_vocab_drafter)
    assert loaded.drafter is None and "tokenizer" in loaded.drafter_refused  # the target loaded alone
    assert not window.banner.isVisible()
    _shown_on_decoding_tabs(window, "The drafter was refused")
    assert "tokenizer" in window.speculation.text()


@pytest.fixture(scope="module")
def hopeless_drafter(tmp_path_factory, tiny_dirs):
    """The tiny target's weights plus noise 3x their spread: its drafts are ~never accepted."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.testing.tiny_models import perturbed_copy

    path = tmp_path_factory.mktemp("hopeless") / "tiny-hopeless"
    target = AutoModelForCausalLM.from_pretrained(tiny_dirs[0])
    perturbed_copy(target, 3.0, 7).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_dirs[0]).save_pretrained(path)
    return path


def test_the_controller_switching_speculation_off_is_explained(qtbot, make_window, tiny_dirs, hopeless_drafter):
    window = make_window(load=False)
    _load(qtbot, window, tiny_dirs[0], hopeless_drafter)
    window.tabs.setCurrentWidget(window.demo)
    assert not window.speculation.isVisible()
    window.demo.prompt.setPlainText("def add(a, b):")
    window.demo.controls.max_new_tokens.setValue(40)
    with qtbot.waitSignal(window.demo_finished, timeout=120_000) as done:
        window.demo.run_button.click()
    off = done.args[0].speculative.stats.speculation_off_steps
    assert off > 0
    _shown_on_decoding_tabs(window, "switched itself off")
    assert f"{off} of" in window.speculation.text() and "fixed draft length" in window.speculation.text()


def test_each_cause_has_its_own_words():
    from app.shell.speculation_status import SpeculationState, explain

    texts = {explain(SpeculationState(choice="off")), explain(SpeculationState(refused="x")),
             explain(SpeculationState(engine_note="y")), explain(SpeculationState(loaded_kind="lookup")),
             explain(SpeculationState(choice="lookup")), explain(SpeculationState(off_steps=3, steps=9))}
    assert len(texts) == 6 and "" not in texts
    assert explain(SpeculationState()) == ""


def test_a_reply_that_gave_threads_to_other_programs_says_so():
    from app.shell.speculation_status import SpeculationState, explain

    assert explain(SpeculationState(threads_fewest=2, threads_max=2)) == ""
    note = explain(SpeculationState(threads_fewest=1, threads_max=2))
    assert "ran on 1 of 2 threads" in note and "Other programs" in note
    both = explain(SpeculationState(threads_fewest=1, threads_max=2, off_steps=3, steps=9))
    assert "switched itself off" in both and "1 of 2 threads" in both


@pytest.mark.skipif(__import__("os").cpu_count() < 2, reason="one core: no thread to give up")
def test_the_demo_beside_busy_programs_runs_on_fewer_threads_and_says_so(qtbot, make_window):
    """Busy threads on every core while the demo runs (tiny real pair): the engine's thread
    policy gives threads up, the reply's stats count it, and the status line says so."""
    import torch

    from engine.bench.background_load import BackgroundLoad

    window = make_window()
    session = window.host.worker.state.session
    session.threads.interval_s = 0.0  # a tiny model's reply is short: sample before every step
    session.threads.max_threads = max(2, session.threads.max_threads)
    window.tabs.setCurrentWidget(window.demo)
    window.demo.prompt.setPlainText("def add(a, b):")
    window.demo.controls.max_new_tokens.setValue(40)
    with BackgroundLoad(threads=torch.get_num_threads() * 2):
        with qtbot.waitSignal(window.demo_finished, timeout=120_000) as done:
            window.demo.run_button.click()
    stats = done.args[0].speculative.stats
    assert stats.threads_max == session.threads.max_threads and stats.threads_fewest < stats.threads_max
    assert f"ran on {stats.threads_fewest} of {stats.threads_max} threads" in window.speculation.text()
