"""The default pair's precision in the app: it loads from its GGUF file at "file" by default, the
precision combos name each choice as the engine does ("As in the file (Q8_0)" first, then what
dequantizes or re-quantizes it), and a choice made in the picker's panel is what the next load uses.

The default pair is replaced by a tiny Q8_0 GGUF file (target and drafter), assembled in the
test's cache as the set-up assembles the real one."""
from __future__ import annotations

import hashlib

import pytest

from tests.app.conftest import wait_idle


@pytest.fixture
def tiny_default_pair(tmp_path, monkeypatch):
    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer

    tokenizer = build_tokenizer()
    made = write_gguf(build_model("qwen2", len(tokenizer), init=0.1), tokenizer, tmp_path / "tiny.gguf", "Q8_0")
    data = made.read_bytes()
    spec = default_pair.GgufSpec("toy", "toy.gguf", (), hashlib.sha256(data).hexdigest(), len(data))
    default_pair.assemble(spec, [made], cache_dir() / "gguf")
    monkeypatch.setattr(default_pair, "TARGET", spec)
    monkeypatch.setattr(default_pair, "DRAFTER", spec)
    default_pair.prepare(spec)  # its converted folder, as the set-up leaves it
    return spec


def _show_default_row(window):
    from app.bridge.messages import MachineReport
    from engine.models.planning.hardware import Hardware

    hardware = Hardware.from_profile({"ram_gb": 16, "cpu_cores": 2, "disk_free_gb": 100})
    window.models.show_report(MachineReport(hardware, (), frozenset(), True))  # no catalog: the bundled row
    window.models.table.selectRow(0)


def _items(combo):
    return [(combo.itemText(i), combo.itemData(i)) for i in range(combo.count())]


def test_the_default_pair_loads_its_gguf_file_and_the_combos_say_what_each_precision_is(
        qtbot, app_settings, tiny_default_pair):
    from app.shell.window import MainWindow

    window = MainWindow(app_settings, autoload=False)
    qtbot.addWidget(window)
    window.show()
    _show_default_row(window)
    panel = window.models.settings_panel
    assert panel.entry_id == "default-offline"
    assert _items(panel.precision) == [
        ("As in the file (Q8_0)", "file"), ("bf16 (dequantized from Q8_0)", "bf16"),
        ("fp32 (exact, dequantized from Q8_0)", "fp32"), ("int8 (re-quantized from Q8_0)", "int8"),
        ("int4 (re-quantized from Q8_0)", "int4")]
    assert panel.precision.currentData() == "file"  # nothing chosen yet: the pair's default

    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        window.load_default()
    assert loaded.args[0].precision == "file" and loaded.args[0].target_path.endswith("toy.gguf")
    wait_idle(qtbot, window)
    combo = window.demo.controls.precision
    assert _items(combo) == _items(panel.precision)
    assert combo.currentText() == "As in the file (Q8_0)" and "As in the file (Q8_0)" in window.model_label.text()

    # The demo's choice reloads the pair from its converted folder, named for what it is.
    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        combo.setCurrentIndex(combo.findData("int8"))
        combo.activated.emit(combo.currentIndex())
    assert loaded.args[0].precision == "int8" and loaded.args[0].target_path.endswith("toy")
    wait_idle(qtbot, window)
    assert combo.currentText() == "int8 (re-quantized from Q8_0)"
    assert window.models.app_precision != "file"  # other models never follow one file's own quantization
    window.close()


def test_a_precision_chosen_for_the_default_pair_survives_a_restart_and_loads(qtbot, app_settings, tiny_default_pair):
    from app.shell.window import MainWindow

    window = MainWindow(app_settings, autoload=False)
    qtbot.addWidget(window)
    window.show()
    _show_default_row(window)
    panel = window.models.settings_panel
    panel.precision.setCurrentIndex(panel.precision.findData("fp32"))
    panel.precision.activated.emit(panel.precision.currentIndex())
    window.close()

    again = MainWindow(app_settings, autoload=False)
    qtbot.addWidget(again)
    again.show()
    _show_default_row(again)
    assert again.models.settings_panel.precision.currentText() == "fp32 (exact, dequantized from Q8_0)"
    with qtbot.waitSignal(again.model_loaded, timeout=120_000) as loaded:
        again.load_default()
    assert loaded.args[0].precision == "fp32" and loaded.args[0].target_path.endswith("toy")
    wait_idle(qtbot, again)
    # Back to the default: the GGUF file again.
    panel = again.models.settings_panel
    panel.precision.setCurrentIndex(panel.precision.findData("file"))
    panel.precision.activated.emit(panel.precision.currentIndex())
    with qtbot.waitSignal(again.model_loaded, timeout=120_000) as loaded:
        again.load_default()
    assert loaded.args[0].precision == "file"
    wait_idle(qtbot, again)
    again.close()
