"""The picker shows the real catalog with memory fit for a described machine."""
from app.messages import MachineReport
from app.models_view import ModelsView


def test_picker_rows_badges_and_recommendation(qtbot):
    from engine.models.catalog import load_catalog
    from engine.models.fit import recommend
    from engine.models.hardware import Hardware

    hardware = Hardware.from_profile({"ram_gb": 16, "gpus": [{"name": "RTX 4060", "vram_gb": 8}], "disk_free_gb": 200})
    fits = recommend(load_catalog(), hardware, 4096)
    view = ModelsView()
    qtbot.addWidget(view)
    view.show_report(MachineReport(hardware, tuple(fits), frozenset(), default_pair_ready=True))
    assert view.table.rowCount() == len(fits)
    selected = view.selected()
    assert selected.recommended and "recommended" in view.table.item(view.table.currentRow(), 0).text()
    assert "RTX 4060" in view.hardware.text() and "RAM 16.0 GB" in view.hardware.text() and "0 cores" not in view.hardware.text()
    badges = {view.table.item(r, 3).text() for r in range(view.table.rowCount())}
    assert "Fits on GPU" in badges and "Does not fit" in badges
    none_row = next(r for r in range(view.table.rowCount()) if view.table.item(r, 3).text() == "Does not fit")
    assert "does not fit" in view.table.item(none_row, 3).toolTip()
    # The bundled pair is installed: selecting it enables Load, not Download.
    offline = next(r for r, f in enumerate(view.rows) if f.entry.id == "default-offline")
    view.table.selectRow(offline)
    assert view.load_button.isEnabled() and not view.download_button.isEnabled()
    view.table.selectRow(none_row)
    assert not view.load_button.isEnabled()
