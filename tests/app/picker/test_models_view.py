"""The picker shows the real catalog with memory fit for a described machine."""
from app.bridge.messages import MachineReport
from app.picker.model_rows import FIT, SPEED, VARIANT
from app.picker.models_view import ModelsView


def test_picker_rows_badges_and_recommendation(qtbot):
    from engine.models.planning.catalog import load_catalog
    from engine.models.planning.fit import recommend
    from engine.models.planning.hardware import Hardware

    hardware = Hardware.from_profile({"ram_gb": 16, "gpus": [{"name": "RTX 4060", "vram_gb": 8}], "disk_free_gb": 200})
    fits = recommend(load_catalog(), hardware, 4096)
    view = ModelsView()
    qtbot.addWidget(view)
    view.show_report(MachineReport(hardware, tuple(fits), frozenset(), default_pair_ready=True))
    assert view.table.rowCount() == len(fits)
    selected = view.selected()
    assert selected.recommended and "recommended" in view.table.item(view.table.currentRow(), 0).text()
    assert "RTX 4060" in view.hardware.text() and "RAM 16.0 GB" in view.hardware.text() and "0 cores" not in view.hardware.text()
    badges = {view.table.item(r, FIT).text() for r in range(view.table.rowCount())}
    assert "Fits on GPU" in badges and "Does not fit" in badges
    none_row = next(r for r in range(view.table.rowCount()) if view.table.item(r, FIT).text() == "Does not fit")
    assert "does not fit" in view.table.item(none_row, FIT).toolTip()
    # The bundled pair is installed: selecting it enables Load, not Download.
    offline = next(r for r, f in enumerate(view.rows) if f.entry.id == "default-offline")
    view.table.selectRow(offline)
    assert view.load_button.isEnabled() and not view.download_button.isEnabled()
    view.table.selectRow(none_row)
    assert not view.load_button.isEnabled()


def _cpu_report(view, cores=2):
    from engine.models.planning.catalog import load_catalog
    from engine.models.planning.fit import recommend
    from engine.models.planning.hardware import Hardware

    hardware = Hardware.from_profile({"ram_gb": 16, "cpu_cores": cores, "disk_free_gb": 200})
    fits = recommend(load_catalog(), hardware, 4096)
    view.show_report(MachineReport(hardware, tuple(fits), frozenset(), default_pair_ready=True))
    return fits


def _row(view, entry_id):
    return next(r for r, f in enumerate(view.rows) if f.entry.id == entry_id)


def test_memory_fit_and_speed_follow_the_models_precision(qtbot, app_settings):
    from app.picker.model_settings import ModelSettingsStore

    view = ModelsView(ModelSettingsStore(app_settings))
    qtbot.addWidget(view)
    _cpu_report(view)
    assert view.table.horizontalHeaderItem(VARIANT).text() == "Variant"  # and the precision it loads at
    row = _row(view, "default-offline")
    assert view.load_precision("default-offline") == "file"  # the default pair: its GGUF file, by default
    view.table.selectRow(row)
    panel = view.settings_panel
    panel.precision.setCurrentIndex(panel.precision.findData("bf16"))  # its converted folder, bf16
    panel.precision.activated.emit(panel.precision.currentIndex())
    row = _row(view, "default-offline")
    memory_bf16 = view.table.item(row, VARIANT).text()
    assert memory_bf16.startswith("bf16 · ")
    speed_bf16 = view.speed(view.rows[row]).tok_s
    total_bf16 = view.rows[row].estimate.total
    panel.precision.setCurrentIndex(panel.precision.findData("int4"))
    panel.precision.activated.emit(panel.precision.currentIndex())
    row = _row(view, "default-offline")
    memory_int4 = view.table.item(row, VARIANT).text()
    assert memory_int4.startswith("int4 · ") and memory_int4 != memory_bf16
    assert view.rows[row].estimate.total < 0.7 * total_bf16 and view.rows[row].precision == "int4"
    speed_int4 = view.speed(view.rows[row])
    # Bytes read per token shrink ~3.2x from bf16 to int4; the int4 kernels stream faster too.
    assert speed_int4.tok_s > 3 * speed_bf16 and speed_int4.tok_s > 15
    assert "int4" in view.table.item(row, SPEED).toolTip() and "docs/benchmarks" in view.table.item(row, SPEED).toolTip()
    assert "tok/s" in view.table.item(row, SPEED).text()
    assert view.selected().entry.id == "default-offline"  # the selection survives the re-sort


def test_rows_sort_by_fit_then_speed_and_filter(qtbot, app_settings):
    from app.picker.model_settings import ModelSettingsStore
    from engine.models.planning.memory_fit import FIT_ORDER

    view = ModelsView(ModelSettingsStore(app_settings))
    qtbot.addWidget(view)
    _cpu_report(view)
    keys = [(FIT_ORDER[f.fit], -(view.speed(f).tok_s if view.speed(f) else 0)) for f in view.rows]
    assert keys == sorted(keys)
    view.filter.setText("qwen coder")
    shown = [f for r, f in enumerate(view.rows) if not view.table.isRowHidden(r)]
    assert shown and len(shown) < len(view.rows)
    assert all("qwen" in (f.entry.name + f.entry.family + f.entry.target_repo).lower() for f in shown)
    view.filter.clear()
    assert not any(view.table.isRowHidden(r) for r in range(view.table.rowCount()))


def test_one_primary_button_load_or_download(qtbot, app_settings):
    from app.picker.model_settings import ModelSettingsStore

    view = ModelsView(ModelSettingsStore(app_settings))
    qtbot.addWidget(view)
    view.show()
    _cpu_report(view)
    view.table.selectRow(_row(view, "default-offline"))  # installed: Load
    assert view.load_button.isVisible() and view.load_button.isDefault() and not view.download_button.isVisible()
    other = next(r for r, f in enumerate(view.rows) if f.entry.id != "default-offline" and f.fit != "none")
    view.table.selectRow(other)  # not installed: Download
    assert view.download_button.isVisible() and view.download_button.isDefault() and not view.load_button.isVisible()


def test_the_row_chosen_for_the_user_is_scrolled_into_view(qtbot, app_settings):
    """The settings panel names the selected row; a recommendation below the table's fold is
    scrolled into view, whether the report arrives before the view shows or after."""
    from app.picker.model_settings import ModelSettingsStore

    def visible(view) -> bool:
        rect = view.table.visualRect(view.table.model().index(view.table.currentRow(), 0))
        return view.table.viewport().rect().contains(rect)

    for report_first in (False, True):
        view = ModelsView(ModelSettingsStore(app_settings))
        qtbot.addWidget(view)
        view.resize(1100, 520)
        if report_first:
            _cpu_report(view, cores=16)
        view.show()
        qtbot.waitExposed(view)
        if not report_first:
            _cpu_report(view, cores=16)
        selected = view.table.currentRow()
        assert view.selected().recommended
        row_height = view.table.rowHeight(0)
        # The recommendation lies below what the viewport holds from the top ...
        assert (selected + 1) * row_height > view.table.viewport().height()
        assert visible(view), f"recommended row {selected} not scrolled into view (report first: {report_first})"
        assert view.settings_panel.title() == f"Settings for {view.selected().entry.name}"
        # ... and a re-sort that keeps the selection keeps it in view.
        view.table.scrollToTop()
        view.refresh()
        assert visible(view)
