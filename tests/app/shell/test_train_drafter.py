"""Model > "Train a drafter for this model…" on the tiny pair in a real window (offscreen): the
dialog says what it will do and how long it expects; the training shows its phases in the status
strip; its notice loads the model with the new drafter and the draft model beside it, which the
demo races (the same output, each one's speed and acceptance), and races it with plain decoding; a cancelled run keeps its best drafter so far and the next run resumes it."""
from __future__ import annotations

from app.shell import train_drafter
from app.shell.train_drafter import REPLY_TOKENS, TrainDrafterDialog, expected_minutes, prompt_count
from app.shell.window_parts import UiState
from tests.app.conftest import run_demo, wait_idle


def test_the_dialog_says_what_it_does_and_how_long_it_expects(qtbot, tmp_path):
    prompts = prompt_count()
    assert prompts > 10
    dialog = TrainDrafterDialog(None, "tiny-target", tmp_path / "out", decode_tok_s=20.0)
    qtbot.addWidget(dialog)
    dialog.minutes.setValue(15)
    data_min = prompts * REPLY_TOKENS / 20.0 / 60
    assert expected_minutes(15, prompts, REPLY_TOKENS, 20.0) == data_min + 15
    assert f"About {data_min + 15:.0f} min in all" in dialog.expected.text()
    assert f"{prompts} prompts" in dialog.findChildren(type(dialog.expected))[0].text()
    unmeasured = TrainDrafterDialog(None, "tiny-target", tmp_path / "out", decode_tok_s=None)
    qtbot.addWidget(unmeasured)
    assert "the status bar shows the time left" in unmeasured.expected.text()


def test_the_saved_chats_are_offered_off_by_default_and_counted_when_ticked(qtbot, tmp_path):
    none = TrainDrafterDialog(None, "tiny-target", tmp_path / "out", decode_tok_s=20.0)
    qtbot.addWidget(none)
    assert not none.use_chats.isEnabled() and not none.use_chats.isChecked()
    dialog = TrainDrafterDialog(None, "tiny-target", tmp_path / "out", decode_tok_s=20.0, chats=3, chat_messages=5)
    qtbot.addWidget(dialog)
    assert dialog.use_chats.isEnabled() and not dialog.use_chats.isChecked()  # opt-in
    assert "3 conversations" in dialog.use_chats.text()
    without = dialog.expected.text()
    dialog.use_chats.setChecked(True)
    assert dialog.expected.text() != without
    assert f"{(prompt_count() + 5) * REPLY_TOKENS:,} tokens of replies" in dialog.expected.text()


def test_training_with_the_saved_chats_answers_their_messages(qtbot, make_window, tiny_dirs, tmp_path):
    from transformers import AutoTokenizer

    from app.store.conversations import Conversation
    from engine.distill.distill import read_data

    window = make_window()
    chat = Conversation(messages=[{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "return a"},
                                  {"role": "user", "content": "for i in range(10):"}])
    window.chat.conversations.insert(0, chat)
    out = tmp_path / "with-chats"
    assert train_drafter.start(window, minutes=0.02, limit=4, reply_tokens=16, out=out, with_chats=True)
    wait_idle(qtbot, window)
    assert window.last_trained.saved, window.last_trained.message
    data = read_data(out / "training")
    assert len(data) == 4 + 2  # the shipped prompts and the two messages sent
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[0])
    # The newest message with the conversation before it first, the shipped prompts between.
    for n, sample in zip((3, 1), (data[0], data[2])):
        prompt = tokenizer.apply_chat_template(chat.chat_messages()[:n], add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]
        assert sample.tokens[: sample.first].tolist() == list(prompt) and len(sample) > sample.first


def test_train_then_load_the_model_with_it_and_race_it(qtbot, make_window, tmp_path):
    window = make_window()
    assert window.train_drafter_action.isEnabled()
    out = tmp_path / "tiny-speculator.eagle3"
    stages = []
    window.host.event.connect(lambda e: e.kind == "distill" and stages.append(getattr(e.payload, "stage", None)))

    assert train_drafter.start(window, minutes=0.02, limit=6, reply_tokens=16, out=out)

    assert window.state is UiState.TRAINING and window.cancel_button.isVisible()
    wait_idle(qtbot, window)
    assert not window.banner.isVisible(), window.banner.text.text()
    assert {"Writing replies to learn from", "Training the drafter"} <= set(stages)
    assert window.trained_notice.isVisible() and "Drafter trained" in window.trained_notice.text.text()
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()

    draft_model = window.loaded.draft_model_path
    assert draft_model and window.loaded.race_against is None  # the tiny draft model drafts alone
    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        window.trained_notice.use_button.click()
    loaded = loaded.args[0]
    assert "EAGLE-3" in loaded.drafter and loaded.drafter_path == str(out)
    # The draft model it drafted with before is loaded beside it, and the demo races the two.
    assert loaded.draft_model_path == draft_model and loaded.race_against == "tiny-drafter"
    wait_idle(qtbot, window)
    controls = window.demo.controls
    assert controls.drafter_kind() == "race"
    race = run_demo(qtbot, window, max_new_tokens=16)  # a fixed draft length: both lanes draft
    assert race.speculative.token_ids == race.plain.token_ids
    assert race.plain.stats.drafted > 0 and race.speculative.stats.drafted > 0
    assert "Draft model: tiny-drafter" in window.demo.headers["plain"].name.text()
    assert "EAGLE-3" in window.demo.headers["speculative"].name.text()
    assert " / " in window.demo.values["acceptance"].text()

    # Against plain decoding, as with any drafter.
    controls.drafter.setCurrentIndex(controls.drafter.findData("model"))
    result = run_demo(qtbot, window, max_new_tokens=16)
    assert result.speculative.token_ids == result.plain.token_ids == race.plain.token_ids
    assert result.speculative.stats.drafted > 0 and result.plain.stats.drafted == 0
    assert "Without speculation" in window.demo.headers["plain"].name.text()


def test_cancel_keeps_the_best_so_far_and_the_next_run_resumes(qtbot, make_window, tmp_path):
    window = make_window()
    out = tmp_path / "tiny-speculator.eagle3"
    details = []
    window.host.event.connect(lambda e: e.kind == "distill" and details.append(getattr(e.payload, "detail", "")))

    train_drafter.start(window, minutes=30, limit=6, reply_tokens=16, out=out)
    qtbot.waitUntil(lambda: window.progress_detail.text().startswith("Training the drafter"), timeout=120_000)
    window.cancel()
    wait_idle(qtbot, window)

    assert window.last_trained.stopped and window.last_trained.saved
    assert "Training stopped" in window.trained_notice.text.text()
    assert (out / "config.json").is_file() and (out / "training" / "state.pt").is_file()
    details.clear()
    train_drafter.start(window, minutes=0.02, limit=6, reply_tokens=16, out=out)
    wait_idle(qtbot, window)
    assert any("texts from an earlier run" in d for d in details) and any("resumed after" in d for d in details)
    assert not window.last_trained.stopped


def test_a_models_trained_drafter_is_chosen_by_its_setting(qtbot, make_window, tiny_dirs, tmp_path):
    """The per-model Drafter setting "Trained here" loads the drafter trained beside the model,
    and says so where none was trained yet (its usual drafter drafts then)."""
    import shutil

    from app.bridge import jobs
    from app.bridge.distill_jobs import default_drafter_folder
    from app.picker.model_settings import ModelSettings

    target = shutil.copytree(tiny_dirs[0], tmp_path / "tiny-target")
    settings = ModelSettings(precision="fp32", drafter="trained")
    window = make_window(load=False)
    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        window._submit("load", jobs.load_models(str(target), str(tiny_dirs[1]), "fp32", settings=settings))
    assert "no drafter was trained for this model yet" in loaded.args[0].note
    assert loaded.args[0].drafter_path == str(tiny_dirs[1])
    wait_idle(qtbot, window)

    assert train_drafter.start(window, minutes=0.02, limit=6, reply_tokens=16)
    wait_idle(qtbot, window)
    assert window.last_trained.out == str(default_drafter_folder(target))
    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        window._submit("load", jobs.load_models(str(target), str(tiny_dirs[1]), "fp32", settings=settings))
    assert "EAGLE-3" in loaded.args[0].drafter and loaded.args[0].drafter_path == str(default_drafter_folder(target))
    assert not loaded.args[0].note
