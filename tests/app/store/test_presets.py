"""Presets: shipped ones copied on first run, bad files skipped, and in a real window a preset
really changes the request, is saved, and comes back after a restart."""
import json

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QInputDialog

from app.store.presets import BUNDLED, Preset, PresetStore, describe_skipped
from engine.core.paths import data_dir
from tests.app.conftest import wait_idle


def test_shipped_presets_are_copied_once(tmp_path):
    store = PresetStore(tmp_path / "presets")
    copied = store.install_bundled()
    assert {p.name for p in copied} == {p.name for p in BUNDLED.glob("*.json")}
    assert {"Coding", "Precise", "Creative"} <= {p.name for p in store.load_all()}
    (tmp_path / "presets" / "coding.json").unlink()  # the person removed one: it stays removed
    assert store.install_bundled() == []
    assert "Coding" not in {p.name for p in store.load_all()}


def test_a_bad_preset_file_is_skipped_with_a_notice(tmp_path):
    directory = tmp_path / "presets"
    directory.mkdir()
    (directory / "broken.json").write_text("{not json")
    (directory / "wrong.json").write_text(json.dumps({"name": "Hot", "temperature": "very"}))
    (directory / "fine.json").write_text(json.dumps({"name": "Fine", "temperature": 0.3}))
    store = PresetStore(directory)
    assert [p.name for p in store.load_all()] == ["Fine"]
    assert {s.path.name for s in store.skipped} == {"broken.json", "wrong.json"}
    assert "temperature" in next(s.reason for s in store.skipped if s.path.name == "wrong.json")
    assert "2 preset files" in describe_skipped(store.skipped)
    assert (directory / "broken.json").read_text() == "{not json"  # never rewritten


def test_save_round_trips_and_never_overwrites_another_preset(tmp_path):
    store = PresetStore(tmp_path)
    mine = Preset(name="My code", system_prompt="be terse", temperature=0.4, top_k=20, seed=7, drafter="lookup", draft_length=4)
    path = store.save(mine)
    assert store.load_all() == [mine]
    other = Preset(name="My-code!")  # the same file name once made safe
    assert store.save(other) != path
    assert sorted(p.name for p in store.load_all()) == ["My code", "My-code!"]
    settings = mine.decode_settings()
    assert (settings.mode, settings.temperature, settings.top_k, settings.seed, settings.draft_length) == ("sample", 0.4, 20, 7, 4)
    assert Preset(name="g").decode_settings().mode == "greedy"  # temperature 0 is greedy


def _answer_next_dialog(text):
    def fill():
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, QInputDialog)
        dialog.setTextValue(text)
        dialog.accept()

    QTimer.singleShot(50, fill)


def test_a_preset_changes_the_request_is_saved_and_reloads_after_a_restart(qtbot, make_window, app_settings):
    window = make_window()
    panel = window.chat.panel
    names = [panel.preset.itemText(i) for i in range(panel.preset.count())]
    assert {"Coding", "Precise", "Creative"} <= set(names)
    panel.preset.setCurrentIndex(panel.preset.findText("Creative"))
    panel.preset.activated.emit(panel.preset.currentIndex())
    assert panel.temperature.value() == 0.9 and panel.top_k.value() == 50 and panel.draft_length.value() == 3
    panel.max_new_tokens.setValue(12)  # keep the tiny model's reply short
    assert panel.preset.currentText() == "Custom"
    _answer_next_dialog("Short creative")
    panel.save_button.click()
    assert panel.preset.currentText() == "Short creative"
    saved = json.loads((data_dir() / "presets" / "short-creative.json").read_text())
    assert saved["max_new_tokens"] == 12 and saved["temperature"] == 0.9

    requests = []
    window.chat.send_requested.connect(lambda messages, settings, drafter: requests.append((messages, settings, drafter)))
    window.chat.input.setPlainText("a poem, please")
    window.chat.send_button.click()
    qtbot.waitUntil(lambda: not window.chat.running, timeout=120_000)
    wait_idle(qtbot, window)
    messages, settings, drafter = requests[0]
    assert messages[0] == {"role": "system", "content": saved["system_prompt"]}
    assert (settings.mode, settings.temperature, settings.top_p, settings.top_k, settings.max_new_tokens, settings.seed,
            settings.draft_length) == ("sample", 0.9, 0.95, 50, 12, 0, 3)
    assert drafter == "model"
    assert window.chat.current.system_prompt == saved["system_prompt"]
    window.close()

    again = make_window(settings=app_settings, load=False)
    panel = again.chat.panel
    assert panel.preset.currentText() == "Short creative" and panel.max_new_tokens.value() == 12
    panel.preset.setCurrentIndex(panel.preset.findText("Precise"))
    panel.preset.activated.emit(panel.preset.currentIndex())
    assert again.chat.decode_settings().mode == "greedy"
    panel.preset.setCurrentIndex(panel.preset.findText("Short creative"))
    panel.preset.activated.emit(panel.preset.currentIndex())
    assert again.chat.decode_settings() == settings
    assert again.chat.current.system_prompt == saved["system_prompt"]  # the chat reopened with its prompt


def test_a_bad_preset_file_is_named_in_the_window(qtbot, make_window):
    directory = data_dir() / "presets"
    directory.mkdir(parents=True)
    (directory / "broken.json").write_text("[]")
    window = make_window(load=False)
    assert "broken.json" in window.storage_notice.text.text()
    assert [window.chat.panel.preset.itemText(i) for i in range(window.chat.panel.preset.count())] == ["Default"]
