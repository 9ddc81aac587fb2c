"""The picker speaks GGUF: each row's variant, file size, memory fit and source; local models
found in LM Studio's / Ollama's / llama.cpp's folders with their drafter or why prompt lookup
drafts; "Add model file…"; a GGUF variant's download from the loopback fake Hub."""
from __future__ import annotations

import pytest

from app.bridge.messages import MachineReport
from app.picker.model_rows import (
    COLUMNS,
    DRAFTER,
    FIT,
    MEMORY,
    SIZE,
    SOURCE,
    VARIANT,
    installed_for,
)
from app.picker.models_view import ModelsView
from engine.models.planning.memory_fit import human_bytes
from tests.app.conftest import wait_idle
from tests.local_stores import isolate_local_stores

TARGET = "tiny-org/tiny-target-GGUF/tiny-target-Q4_0"
OTHER = "tiny-org/other-vocab-GGUF/other-vocab-Q8_0"
CATALOG_ID = "qwen2.5-coder-1.5b"


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    """A Q4_0 target, a smaller Q8_0 drafter of its vocabulary, a model of another vocabulary."""
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer

    folder = tmp_path_factory.mktemp("picker-ggufs")
    tokenizer, other = build_tokenizer(), build_tokenizer(vocab_size=300)
    return {
        "target": write_gguf(build_model("qwen2", len(tokenizer), layers=4), tokenizer,
                             folder / "tiny-target-Q4_0.gguf", "Q4_0"),
        "drafter": write_gguf(build_model("qwen2", len(tokenizer), layers=2, seed=1), tokenizer,
                              folder / "tiny-drafter-Q8_0.gguf", "Q8_0"),
        "other": write_gguf(build_model("qwen2", len(other), layers=1), other, folder / "other-vocab-Q8_0.gguf", "Q8_0"),
    }


@pytest.fixture
def home(tmp_path, monkeypatch):
    return isolate_local_stores(tmp_path, monkeypatch)


def _cpu_report(view):
    from engine.models.planning.catalog import load_catalog
    from engine.models.planning.fit import recommend
    from engine.models.planning.hardware import Hardware

    hardware = Hardware.from_profile({"ram_gb": 16, "cpu_cores": 4, "disk_free_gb": 200})
    fits = recommend(load_catalog(), hardware, 4096)
    view.show_report(MachineReport(hardware, tuple(fits), frozenset(), default_pair_ready=True))
    return hardware


def _row(view, entry_id):
    return next(r for r, f in enumerate(view.rows) if f is not None and f.entry.id == entry_id)


def _text(view, row, column):
    return view.table.item(row, column).text()


def test_catalog_rows_show_variant_size_fit_and_source(qtbot, app_settings):
    from app.picker.model_settings import ModelSettingsStore

    view = ModelsView(ModelSettingsStore(app_settings))
    qtbot.addWidget(view)
    _cpu_report(view)
    assert [view.table.horizontalHeaderItem(c).text() for c in range(len(COLUMNS))] == COLUMNS
    row = _row(view, CATALOG_ID)
    fit = view.rows[row]
    quants = [v.quant for v in fit.entry.variants]
    # On a CPU the GGUF file wins: it reads a third of bf16's bytes per token.
    assert fit.variant in quants and fit.precision == "file"
    assert _text(view, row, VARIANT) == fit.variant
    assert _text(view, row, SIZE) == human_bytes(fit.file_bytes) and fit.gguf.files[0] in view.table.item(row, SIZE).toolTip()
    assert _text(view, row, MEMORY) == human_bytes(fit.estimate.total)
    assert "KV cache" in view.table.item(row, MEMORY).toolTip() and "drafter" in view.table.item(row, MEMORY).toolTip()
    assert _text(view, row, FIT) == "Fits in RAM (CPU)" and _text(view, row, SOURCE) == "Hub"
    assert "0.5B" in _text(view, row, DRAFTER)

    # The other variants, in the detail area: every GGUF build and the safetensors.
    view.table.selectRow(row)
    labels = [view.variant.itemText(i) for i in range(view.variant.count())]
    assert len(labels) == len(quants) + 1 and any("safetensors" in label for label in labels)
    assert all(any(label.startswith(q) for label in labels) for q in quants)
    other = next(q for q in quants if q != fit.variant)
    view.variant.setCurrentIndex(next(i for i, label in enumerate(labels) if label.startswith(other)))
    view.variant.activated.emit(view.variant.currentIndex())
    row = _row(view, CATALOG_ID)
    chosen = view.rows[row]
    assert chosen.variant == other and _text(view, row, VARIANT) == other
    assert _text(view, row, SIZE) == human_bytes(next(v.file_bytes for v in fit.entry.variants if v.quant == other))
    assert view.selected().entry.id == CATALOG_ID  # the choice keeps the row selected
    # The filter reads the new columns too: a variant name finds its rows.
    view.filter.setText(other)
    visible = [r for r in range(view.table.rowCount()) if not view.table.isRowHidden(r)]
    assert row in visible and len(visible) < view.table.rowCount()
    view.filter.setText("")


def _window(qtbot, app_settings):
    from app.shell.window import MainWindow

    window = MainWindow(app_settings, autoload=False)
    qtbot.addWidget(window)
    window.show()
    return window


def _local_rows(view):
    return {view.local[f.entry.id].model.name: r for r, f in enumerate(view.rows) if f is not None and f.entry.id in view.local}


def test_discovered_lmstudio_model_shows_source_drafter_and_refusal(qtbot, app_settings, home, ggufs, tmp_path):
    from tests.engine.library.conftest import place_lmstudio, place_ollama

    place_lmstudio(home, ggufs["target"], "tiny-org", "tiny-target-GGUF")
    place_lmstudio(home, ggufs["other"], "tiny-org", "other-vocab-GGUF")
    place_ollama(tmp_path / "ollama", ggufs["drafter"], "tiny-drafter")
    window = _window(qtbot, app_settings)
    view = window.models
    qtbot.waitUntil(lambda: len(_local_rows(view)) == 3, timeout=60_000)
    rows = _local_rows(view)
    target = rows[TARGET]
    assert _text(view, target, SOURCE) == "LM Studio" and _text(view, target, VARIANT) == "Q4_0"
    assert _text(view, target, SIZE) == human_bytes(ggufs["target"].stat().st_size)
    assert _text(view, target, DRAFTER) == "tiny-drafter:latest"
    assert "shares the vocabulary" in view.table.item(target, DRAFTER).toolTip()
    assert _text(view, rows["tiny-drafter:latest"], SOURCE) == "Ollama"
    # Another vocabulary: prompt lookup, and which candidate was turned down, and why.
    other = rows[OTHER]
    assert _text(view, other, DRAFTER).startswith("prompt lookup")
    tip = view.table.item(other, DRAFTER).toolTip()
    assert f"vocabulary: {TARGET} differs at token id" in tip
    view.table.selectRow(other)
    assert "Drafting by prompt lookup" in view.detail.text() and TARGET in view.detail.text()
    assert view.variant.count() == 1 and view.variant.itemText(0).startswith("Q8_0")
    # Local models are on disk: Load, never Download; the filter finds them by their source.
    view.table.selectRow(_local_rows(view)[TARGET])
    assert view.load_button.isVisible() and view.load_button.isEnabled()
    view.filter.setText("lm studio")
    visible = {r for r in range(view.table.rowCount()) if not view.table.isRowHidden(r)}
    assert visible == {rows[TARGET], rows[OTHER]}
    view.filter.setText("")


def test_a_scan_that_finds_what_is_listed_leaves_the_table_alone(qtbot, app_settings, home, ggufs):
    """The start-up scan lands while the user may already be streaming: the same rows again
    must not rebuild the table on the GUI thread (it took ~0.1 s mid-demo); a change does."""
    from tests.engine.library.conftest import place_lmstudio

    place_lmstudio(home, ggufs["target"], "tiny-org", "tiny-target-GGUF")
    window = _window(qtbot, app_settings)
    view = window.models
    qtbot.waitUntil(lambda: len(_local_rows(view)) == 1, timeout=60_000)
    first = view.table.item(0, 0)
    view.show_local(list(view.local.values()))  # what a second scan reports
    assert view.table.item(0, 0) is first
    view.show_local([])  # the file went away
    assert view.local == {} and view.table.item(0, 0) is not first and not _local_rows(view)


def test_load_runs_a_discovered_file_with_its_drafter(qtbot, app_settings, home, ggufs, tmp_path):
    from tests.engine.library.conftest import place_lmstudio, place_ollama

    place_lmstudio(home, ggufs["target"], "tiny-org", "tiny-target-GGUF")
    place_ollama(tmp_path / "ollama", ggufs["drafter"], "tiny-drafter")
    window = _window(qtbot, app_settings)
    view = window.models
    qtbot.waitUntil(lambda: TARGET in _local_rows(view), timeout=60_000)
    view.table.selectRow(_local_rows(view)[TARGET])
    # Load runs the file itself (precision "file") with the matched drafter (an Ollama blob,
    # through its .gguf link).
    with qtbot.waitSignal(window.model_loaded, timeout=300_000) as loaded:  # a kernel build may run first
        view.load_button.click()
    assert loaded.args[0].precision == "file" and loaded.args[0].drafter_path.endswith(".gguf")
    assert loaded.args[0].target_path.endswith("tiny-target-Q4_0.gguf")
    wait_idle(qtbot, window)
    assert not window.banner.isVisible(), window.banner.text.text()


def test_a_drafter_trained_here_is_named_in_its_row_and_raced_by_its_setting(qtbot, app_settings, home, ggufs, tmp_path):
    """Model > Train a drafter… for a discovered file: its row then names the drafter trained for
    it; the model's Drafter setting "Trained here" loads the file with it and the draft model
    beside it, and the demo races the two."""
    from app.shell import train_drafter
    from tests.app.conftest import run_demo
    from tests.engine.library.conftest import place_lmstudio, place_ollama

    place_lmstudio(home, ggufs["target"], "tiny-org", "tiny-target-GGUF")
    place_ollama(tmp_path / "ollama", ggufs["drafter"], "tiny-drafter")
    window = _window(qtbot, app_settings)
    view = window.models
    qtbot.waitUntil(lambda: TARGET in _local_rows(view), timeout=60_000)
    assert not _text(view, _local_rows(view)[TARGET], DRAFTER).endswith("trained here")
    view.table.selectRow(_local_rows(view)[TARGET])
    with qtbot.waitSignal(window.model_loaded, timeout=300_000) as first:
        view.load_button.click()
    draft_model = first.args[0].drafter  # the Ollama blob's link, by its name
    wait_idle(qtbot, window)

    assert train_drafter.start(window, minutes=0.02, limit=6, reply_tokens=16)
    wait_idle(qtbot, window)
    trained = window.last_trained.out
    row = _local_rows(view)[TARGET]
    assert _text(view, row, DRAFTER) == "tiny-drafter:latest + trained here"
    assert trained in view.table.item(row, DRAFTER).toolTip()

    view.table.selectRow(row)
    panel = view.settings_panel
    panel.drafter.setCurrentIndex(panel.drafter.findData("trained"))
    panel.drafter.activated.emit(panel.drafter.currentIndex())
    with qtbot.waitSignal(window.model_loaded, timeout=300_000) as loaded:
        view.load_button.click()
    loaded = loaded.args[0]
    assert loaded.drafter_path == trained and loaded.race_against == draft_model
    wait_idle(qtbot, window)
    assert window.demo.controls.drafter_kind() == "race"
    race = run_demo(qtbot, window, max_new_tokens=16)
    assert race.identical and race.plain.stats.drafted > 0 and race.speculative.stats.drafted > 0


def test_a_local_gguf_row_offers_the_one_precision_its_load_honours(qtbot, app_settings, home, ggufs):
    # A .gguf target loads at precision "file" only (engine.models.loading.loader refuses any other):
    # the row's precision combo offers that, named for the file, and it is what the load asks.
    from app.picker.model_settings import LOCAL_ID_PREFIX, ModelSettings, ModelSettingsStore
    from engine.library.fit_rows import LOCAL_ID_PREFIX as ENGINE_PREFIX
    from tests.engine.library.conftest import place_lmstudio

    assert LOCAL_ID_PREFIX == ENGINE_PREFIX
    path = place_lmstudio(home, ggufs["target"], "tiny-org", "tiny-target-GGUF")
    # What an earlier picker let this row save: a precision its load ignored.
    ModelSettingsStore(app_settings).set(LOCAL_ID_PREFIX + str(path), ModelSettings(precision="int8"))
    window = _window(qtbot, app_settings)
    view = window.models
    qtbot.waitUntil(lambda: TARGET in _local_rows(view), timeout=60_000)
    view.table.selectRow(_local_rows(view)[TARGET])
    combo = view.settings_panel.precision
    assert [(combo.itemText(i), combo.itemData(i)) for i in range(combo.count())] == [("As in the file (Q4_0)", "file")]
    assert combo.currentData() == "file" and not combo.isEnabled()
    assert view.load_precision(view.selected().entry.id) == "file"
    with qtbot.waitSignal(window.model_loaded, timeout=300_000) as loaded:  # a kernel build may run first
        view.load_button.click()
    event = loaded.args[0]
    assert event.precision == "file" and event.settings.precision == "file"
    assert event.target_path == str(path)
    wait_idle(qtbot, window)
    assert not window.banner.isVisible(), window.banner.text.text()
    # A catalog row still offers the folder precisions (and the app's choice).
    qtbot.waitUntil(lambda: view.report is not None, timeout=60_000)
    view.table.selectRow(next(r for r, f in enumerate(view.rows) if f is not None and f.entry.id not in view.local))
    assert combo.count() == 5 and combo.isEnabled() and combo.itemData(0) == ""


def test_add_model_file_adds_an_imported_row(qtbot, app_settings, home, ggufs):
    from app.picker.add_model import add_model_file

    window = _window(qtbot, app_settings)
    assert window.add_model_action.text().replace("&", "").startswith("Add model file")
    assert window.models.add_button.text().startswith("Add model file")
    qtbot.waitUntil(lambda: window.models.report is not None, timeout=60_000)
    assert add_model_file(window, ggufs["target"])
    wait_idle(qtbot, window)
    assert not window.banner.isVisible(), window.banner.text.text()
    view = window.models
    row = next(r for r, f in enumerate(view.rows) if f is not None and f.source == "imported")
    assert _text(view, row, SOURCE) == "imported" and _text(view, row, VARIANT) == "Q4_0"
    assert view.table.currentRow() == row  # the new model is selected
    assert installed_for(view.rows[row], frozenset())


def test_a_bad_file_shows_the_banner_with_the_reason(qtbot, app_settings, home, tmp_path):
    from app.picker.add_model import add_model_file

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a model at all" * 10)
    window = _window(qtbot, app_settings)
    assert add_model_file(window, bad)
    wait_idle(qtbot, window)
    assert window.banner.isVisible()
    message = window.banner.text.text()
    assert str(bad) in message and message.startswith("Could not add") and "GGUF" in message.upper()
    assert not any(f is not None and f.source == "imported" for f in window.models.rows)


@pytest.fixture
def catalog_hub(ggufs, tmp_path, monkeypatch):
    """The catalog entry's GGUF variants and its drafter's, as tiny files under their real names."""
    from engine.models.planning.catalog import find_entry
    from tests.engine.hub.hub_server import FakeHub
    from tests.engine.hub.test_hub_gguf import point_hf_at

    entry = find_entry(CATALOG_ID)
    point_hf_at(tmp_path, monkeypatch)
    with FakeHub() as server:
        for variants, data in ((entry.variants, ggufs["target"]), (entry.drafter_variants, ggufs["drafter"])):
            files = {"README.md": b"# GGUF builds"}
            for i, v in enumerate(variants):
                for name in v.files:  # padded apart: each file its own blob (the fake CDN serves by sha256)
                    files[name] = data.read_bytes() + b"\0" * i
            server.add_repo(variants[0].repo, extra=files)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server, entry


def test_download_fetches_the_rows_variant_and_its_drafters(qtbot, app_settings, home, catalog_hub):
    from app.picker.downloads import installed_paths
    from engine.hub.gguf_plan import drafter_variant_for
    from engine.models.planning.fit import assess
    from engine.models.planning.hardware import Hardware

    server, entry = catalog_hub
    variant = entry.variants[-1]  # not the download's default: the row's own choice counts
    fit = assess(entry, Hardware.from_profile({"ram_gb": 16, "cpu_cores": 4, "disk_free_gb": 100}), "file", 2048,
                 variant=variant)
    window = _window(qtbot, app_settings)
    assert not installed_for(fit, frozenset())
    window.download_entry(fit)
    assert window.state.value == "Downloading" and window.cancel_button.isVisible()
    wait_idle(qtbot, window)
    assert not window.banner.isVisible(), window.banner.text.text()
    paired = drafter_variant_for(entry, variant)
    fetched = {(e.repo, e.path) for e in server.requests() if e.kind in ("cdn", "resolve") and e.status in (200, 206)}
    assert fetched == {(variant.repo, variant.files[0]), (paired.repo, paired.files[0])}
    target, drafter = installed_paths(entry, variant)
    assert target.name == variant.files[0] and drafter.name == paired.files[0]
    assert installed_for(fit, frozenset())
