"""The picker's EAGLE-3 and DFlash pairs from the real catalog: their rows name the drafter's kind
and count its memory; a download from the loopback fake Hub (a tiny GGUF file under the target
variant's name, a tiny checkpoint in the published layout under the drafter repo's) fetches both,
and the window loads the pair and runs the side-by-side demo with the drafter made for it."""
from __future__ import annotations

import pytest

from app.bridge.messages import MachineReport
from app.picker.model_rows import DRAFTER, MEMORY
from app.picker.models_view import ModelsView
from engine.models.planning.catalog import find_entry
from engine.models.planning.memory_fit import human_bytes
from tests.app.conftest import run_demo, wait_idle
from tests.engine.hub.hub_server import FakeHub
from tests.engine.hub.test_hub_gguf import point_hf_at
from tests.engine.hub.test_hub_made_for_target import serve_pair, write_tiny_pair

PAIRS = {"qwen3-4b-eagle3": "EAGLE-3", "qwen3-8b-eagle3": "EAGLE-3", "llama-3.1-8b-eagle3": "EAGLE-3",
         "qwen3-4b-dflash": "DFlash", "qwen3-8b-dflash": "DFlash"}


def _hardware():
    from engine.models.planning.hardware import Hardware

    return Hardware.from_profile({"ram_gb": 32, "cpu_cores": 4, "disk_free_gb": 200})


def test_each_pair_has_a_row_naming_its_drafters_kind_and_counting_its_memory(qtbot, app_settings):
    from app.picker.model_settings import ModelSettingsStore
    from engine.models.planning.catalog import load_catalog
    from engine.models.planning.fit import recommend

    view = ModelsView(ModelSettingsStore(app_settings))
    qtbot.addWidget(view)
    fits = recommend(load_catalog(), _hardware(), 4096)
    view.show_report(MachineReport(_hardware(), tuple(fits), frozenset(), default_pair_ready=True))
    rows = {f.entry.id: r for r, f in enumerate(view.rows) if f is not None}
    for entry_id, kind in PAIRS.items():
        row, fit = rows[entry_id], next(f for f in fits if f.entry.id == entry_id)
        drafter = view.table.item(row, DRAFTER)
        assert drafter.text().startswith(f"{kind}: ") and fit.entry.drafter_repo in drafter.toolTip()
        assert "made for this model" in drafter.toolTip()
        # The drafter's weights and cache are in the row's memory, apart from the target's.
        memory = view.table.item(row, MEMORY).toolTip()
        assert fit.estimate.drafter > 0 and f"drafter {human_bytes(fit.estimate.drafter)}" in memory
        assert fit.variant == fit.entry.variants[0].quant  # the target runs from its GGUF file here


@pytest.fixture
def pair_hub(tmp_path, monkeypatch):
    entry = find_entry("qwen3-8b-eagle3")
    gguf, folders = write_tiny_pair(tmp_path / "pair")
    point_hf_at(tmp_path, monkeypatch)
    with FakeHub() as server:
        serve_pair(server, entry, gguf, folders["eagle3"])
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server, entry


def test_download_load_and_race_an_eagle3_pair(qtbot, make_window, pair_hub):
    from app.picker.downloads import installed_paths
    from engine.models.planning.fit import assess

    server, entry = pair_hub
    fit = assess(entry, _hardware(), "file", 2048, variant=entry.variants[0])
    window = make_window(load=False)
    window.download_entry(fit)
    wait_idle(qtbot, window)
    assert not window.banner.isVisible(), window.banner.text.text()
    target, drafter = installed_paths(entry, entry.variants[0])
    assert target.name == entry.variants[0].files[0] and (drafter / "config.json").is_file()
    fetched = {(e.repo, e.path) for e in server.requests() if e.kind in ("cdn", "resolve") and e.status in (200, 206)}
    assert (entry.drafter_repo, "model.safetensors") in fetched

    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        window.load_entry(fit)
    assert "EAGLE-3" in loaded.args[0].drafter and loaded.args[0].drafter_kind == "model"
    wait_idle(qtbot, window)
    result = run_demo(qtbot, window, max_new_tokens=16, draft_length=0)
    assert result.speculative.token_ids == result.plain.token_ids and result.speculative.stats.drafted > 0
