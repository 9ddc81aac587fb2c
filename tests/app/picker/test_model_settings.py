"""Per-model settings: edited in the picker's panel, kept across a restart, used by the load."""
import pytest
import torch

from app.bridge.messages import MachineReport
from app.picker.model_settings import ModelSettings
from tests.app.conftest import wait_idle
from tests.app.picker.test_downloads import fake_hub, tiny_entry  # noqa: F401 (fixture)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _show_tiny(window):
    from engine.models.planning.fit import assess
    from engine.models.planning.hardware import Hardware

    hardware = Hardware.from_profile({"ram_gb": 16, "cpu_cores": 2, "disk_free_gb": 100})
    fit = assess(tiny_entry(), hardware, "bf16", 2048)
    window.models.show_report(MachineReport(hardware, (fit,), frozenset({"tiny-test"}), False))
    window.models.table.selectRow(0)
    return fit


def test_settings_survive_a_restart_and_the_load_uses_them(qtbot, make_window, app_settings, fake_hub, restore_threads):
    from app.shell.window import MainWindow

    window = make_window(load=False)
    _show_tiny(window)
    panel = window.models.settings_panel
    assert panel.isEnabled() and panel.entry_id == "tiny-test"
    panel.precision.setCurrentIndex(panel.precision.findData("fp32"))
    panel.precision.activated.emit(panel.precision.currentIndex())
    panel.drafter.setCurrentIndex(panel.drafter.findData("lookup"))
    panel.drafter.activated.emit(panel.drafter.currentIndex())
    panel.draft_length.setValue(3)
    panel.threads.setValue(1)
    panel.keep_in_ram.setChecked(True)
    window.close()

    again = MainWindow(app_settings, autoload=False)
    qtbot.addWidget(again)
    again.show()
    fit = _show_tiny(again)
    panel = again.models.settings_panel
    assert (panel.precision.currentData(), panel.drafter.currentData(), panel.draft_length.value(),
            panel.threads.value(), panel.keep_in_ram.isChecked()) == ("fp32", "lookup", 3, 1, True)
    assert again.models.table.item(0, 2).text().startswith("fp32 · ")  # the picker follows it too

    again.download_entry(fit)
    wait_idle(qtbot, again)
    assert not again.banner.isVisible(), again.banner.text.text()
    with qtbot.waitSignal(again.model_loaded, timeout=120_000) as loaded:
        again.load_entry(fit)
    event = loaded.args[0]
    assert event.settings == ModelSettings(precision="fp32", context=0, drafter="lookup", draft_length=3, threads=1,
                                           keep_in_ram=True)
    assert event.precision == "fp32" and event.threads == 1
    # A folder's weights are loaded into RAM, not mapped: nothing to lock, and the window says so.
    assert "already held in RAM" in event.resident
    assert "already held in RAM" in again.statusBar().currentMessage()
    assert event.drafter is None  # "lookup" loads no draft model
    wait_idle(qtbot, again)
    assert again.demo.controls.drafter_kind() == "lookup" and again.demo.controls.draft_length.value() == 3
    again.close()


def test_a_stored_value_out_of_range_falls_back(app_settings):
    from app.picker.model_settings import ModelSettingsStore

    store = ModelSettingsStore(app_settings)
    app_settings.q.setValue("models/x/drafter", "telepathy")
    app_settings.q.setValue("models/x/draft_length", "99")
    app_settings.q.setValue("models/x/threads", "many")
    assert store.get("x") == ModelSettings(draft_length=8)


def test_keep_in_ram_locks_a_gguf_models_weights(qtbot, make_window, tmp_path):
    from app.bridge import jobs
    from engine.testing.tiny_gguf import write_gguf_pair

    target, drafter = write_gguf_pair(tmp_path)
    window = make_window(load=False)
    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        window._submit("load", jobs.load_models(str(target), str(drafter), "file", settings=ModelSettings(keep_in_ram=True)))
    wait_idle(qtbot, window)
    event = loaded.args[0]
    assert "kept in RAM (mlock)" in event.resident and target.name in event.resident
    assert "kept in RAM" in window.statusBar().currentMessage()


def test_keep_in_ram_is_read_back_as_the_boolean_it_was(app_settings):
    from app.picker.model_settings import ModelSettingsStore

    store = ModelSettingsStore(app_settings)
    store.set("y", ModelSettings(keep_in_ram=False))
    assert store.get("y").keep_in_ram is False  # QSettings hands back the word "false"
    store.set("y", ModelSettings(keep_in_ram=True))
    assert store.get("y").keep_in_ram is True
