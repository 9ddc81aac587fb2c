"""Model picker: what this machine can run, with which drafter, how much memory, how much faster.

One row per model: the catalog's, at its recommended variant (a GGUF file or safetensors, the
other variants in the combo under the table), and the GGUF files found on this machine (LM
Studio, Ollama, llama.cpp, imported). The cells' text comes from app.picker.model_rows."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import QAbstractItemView, QComboBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton
from PySide6.QtWidgets import QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from app.picker import model_rows
from app.picker.model_rows import COLUMNS, FIT_LABELS, SAFETENSORS, Cell
from app.picker.model_settings import ModelSettingsPanel, ModelSettingsStore, default_precision
from engine.models.planning.memory_fit import FIT_ORDER  # torch-free; one way of writing sizes everywhere
from engine.models.planning.precision_labels import FOLDER_PRECISIONS

__all__ = ["ModelsView"]
CONTEXTS = [2048, 4096, 8192, 16384, 32768]


class ModelsView(QWidget):
    load_requested = Signal(object)  # FitResult or None (the default offline pair)
    download_requested = Signal(object)  # FitResult (its variant is what downloads)
    context_changed = Signal(int)
    add_model_requested = Signal()

    def __init__(self, store: ModelSettingsStore | None = None, parent=None) -> None:
        super().__init__(parent)
        if store is None:
            from app.store.app_settings import AppSettings

            store = ModelSettingsStore(AppSettings())
        self.store = store
        #: The precision a model without its own setting loads at (the demo's choice).
        self.app_precision = "bf16"
        self.report = None
        outer = QVBoxLayout(self)
        self.hardware = QLabel("Detecting hardware…")
        self.hardware.setWordWrap(True)
        self.hardware.setStyleSheet("font-size: 12px; padding: 4px 0;")
        top = QHBoxLayout()
        top.addWidget(self.hardware, 1)
        top.addWidget(QLabel("Context length"))
        self.context = QComboBox()
        for n in CONTEXTS:
            self.context.addItem(f"{n // 1024}k tokens", n)
        top.addWidget(self.context)
        outer.addLayout(top)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter models by name, family, repository, variant or source…")
        self.filter.setClearButtonEnabled(True)
        outer.addWidget(self.filter)
        # Said at once on a first run with nothing installed and no network.
        self.offline_notice = QLabel("")
        self.offline_notice.setWordWrap(True)
        self.offline_notice.setStyleSheet("background: #fef7e0; color: #7a5b00; padding: 6px; border-radius: 4px;")
        self.offline_notice.hide()
        outer.addWidget(self.offline_notice)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        # Every column as wide as its text; the drafter's (the longest, in full in its tooltip) takes
        # what is left, so the model names are never the ones cut short.
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COLUMNS.index("Drafter"), QHeaderView.ResizeMode.Stretch)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        outer.addWidget(self.table, 1)
        self.settings_panel = ModelSettingsPanel(store)
        outer.addWidget(self.settings_panel)

        # The selected row: what it says in full (the drafter's refusals too), its variants.
        self.detail = QLabel("")
        self.detail.setWordWrap(True)
        self.detail.setStyleSheet("color: #444;")
        outer.addWidget(self.detail)
        buttons = QHBoxLayout()
        buttons.addWidget(QLabel("Variant"))
        self.variant = QComboBox()
        self.variant.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.variant.setToolTip("This model's builds: each GGUF file (precision \"file\") and the safetensors")
        buttons.addWidget(self.variant)
        buttons.addStretch(1)
        self.add_button = QPushButton("Add model file…")
        self.add_button.setToolTip("Register a .gguf file on this disk (used in place, never copied)")
        self.download_button = QPushButton("Download")
        self.load_button = QPushButton("Load")
        for button in (self.download_button, self.load_button):
            button.setMinimumWidth(120)
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.load_button)
        outer.addLayout(buttons)

        self.rows: list = []  # FitResult per row, None for a bare default-pair row
        self.installed: frozenset[str] = frozenset()
        #: Local GGUF models by row id (engine.library.fit_rows.LocalFit: the fit and its drafting).
        self.local: dict = {}
        self.local_listed = False  # True once the worker has looked (the screenshot waits for it)
        #: The variant each catalog model was switched to ("Q8_0", or "safetensors").
        self.variant_choice: dict[str, str] = {}
        self._variant_options: list = []
        self._row_installed: dict[str, bool] = {}
        self._row_trained: dict[str, object] = {}  # entry id -> a drafter trained here for it (a Path)
        self.busy = False
        self.table.itemSelectionChanged.connect(self._sync)
        self.table.cellDoubleClicked.connect(lambda *_: self._load())
        self.load_button.clicked.connect(self._load)
        self.download_button.clicked.connect(lambda: self.selected() and self.download_requested.emit(self.selected()))
        self.add_button.clicked.connect(self.add_model_requested)
        self.variant.activated.connect(self._variant_chosen)
        self.context.activated.connect(lambda _: self.context_changed.emit(self.context.currentData()))
        self.filter.textChanged.connect(self._apply_filter)
        self.settings_panel.changed.connect(lambda *_: self.refresh())
        self._sync()

    def set_context(self, n: int) -> None:
        self.context.setCurrentIndex(max(0, self.context.findData(n)))

    def selected(self):
        row = self.table.currentRow()
        return self.rows[row] if 0 <= row < len(self.rows) else None

    def _entry_id(self, fit) -> str:
        return fit.entry.id if fit is not None else "default-offline"

    def show_report(self, report) -> None:
        self.report = report
        self.hardware.setText(model_rows.hardware_text(report.hardware) + (f"\n⚠ {report.error}" if report.error else ""))
        self.installed = report.installed | ({"default-offline"} if report.default_pair_ready else frozenset())
        self.refresh()

    def show_local(self, fits, added: str | None = None) -> None:
        """The local GGUF models (app.picker.local_models.LocalModels' rows); ``added``: the file just
        imported, which becomes the selection."""
        local = {f.fit.entry.id: f for f in fits}
        unchanged = added is None and local == self.local
        self.local = local
        self.local_listed = True
        if unchanged:
            # The start-up scan usually finds what is already listed (or nothing): rebuilding
            # the table took ~0.1 s of the GUI thread, in the middle of a streaming demo.
            return
        self.refresh()
        if added is not None:
            row = next((r for r, f in enumerate(self.rows) if f is not None and f.entry.id in self.local
                        and str(self.local[f.entry.id].model.path) == added), None)
            if row is not None:
                self.table.selectRow(row)
                self.reveal_selection()

    def set_app_precision(self, precision: str) -> None:
        if precision != self.app_precision:
            self.app_precision = precision
            self.refresh()

    def _own_precision(self, entry_id: str) -> str:
        own = self.store.get(entry_id).precision or default_precision(entry_id)
        if own:
            return own
        chosen = next((f.precision for f in getattr(self.report, "fits", ()) if f.entry.id == entry_id), None)
        return "int4" if chosen == "int4" else self.app_precision

    def load_precision(self, entry_id: str) -> str:
        """The app's precision name ("file", "bf16", "fp32", "int8", "int4") this model loads at:
        "file" where its row runs a GGUF file; else its own setting; else its own default (the
        default pair: as in its GGUF file); else 4-bit where the fit chose it (16-bit does not fit
        the GPU); else the app's."""
        shown = next((f for f in self.rows if f is not None and f.entry.id == entry_id), None)
        if shown is not None and (getattr(shown, "gguf", None) is not None or model_rows.is_local(shown)):
            return "file"
        return self._own_precision(entry_id)

    def _variant_for(self, fit):
        """The GGUF variant this catalog row runs, or None for its safetensors: the user's
        choice in the variant combo; else none where the model's own precision names a
        safetensors one; else the recommendation's."""
        choice = self.variant_choice.get(fit.entry.id)
        if choice == SAFETENSORS:
            return None
        if choice:
            return next((v for v in fit.entry.variants if v.quant == choice), None)
        own = self.store.get(fit.entry.id).precision
        if own and own != "file":
            return None
        return getattr(fit, "gguf", None)

    def _reassess(self, fit):
        """The fit at the variant, precision and context this model will load at."""
        if model_rows.is_local(fit):
            return fit
        hw = getattr(self.report, "hardware", None)
        context = self.store.get(fit.entry.id).context or fit.context
        variant = self._variant_for(fit)
        if hw is None:
            return fit
        from dataclasses import replace

        from engine.models.planning.fit import assess

        if variant is not None:
            if variant == getattr(fit, "gguf", None) and context == fit.context:
                return fit
            result = assess(fit.entry, hw, "file", context, variant=variant)
            return replace(result, recommended=fit.recommended and result.fit != "none")
        precision = self._own_precision(fit.entry.id)
        # "file" without a GGUF variant of its own to run: the safetensors at 16 bits.
        if precision not in FOLDER_PRECISIONS:
            precision = fit.precision if fit.precision != "file" else "bf16"
        if getattr(fit, "gguf", None) is None and precision == fit.precision and context == fit.context:
            return fit
        result = assess(fit.entry, hw, precision, context)
        return replace(result, recommended=fit.recommended and result.fit != "none")

    def speed(self, fit):
        """engine.models.planning.decode_speed.SpeedHint for a CPU fit, else None."""
        return model_rows.speed_hint(getattr(self.report, "hardware", None), fit)

    def refresh(self) -> None:
        """Rebuild the rows from the last report and the local models: each model at its load
        variant and precision, best fit first, then the fastest expected."""
        if self.report is None and not self.local:
            return
        keep = self._entry_id(self.selected()) if self.table.currentRow() >= 0 else None
        fits = [self._reassess(f) for f in getattr(self.report, "fits", ())]
        fits += [f.fit for f in self.local.values()]
        speeds = {f.entry.id: self.speed(f) for f in fits}
        targets = {f.entry.id: model_rows.target_files(f, self.installed, self.local.get(f.entry.id)) for f in fits}
        self._row_installed = {key: files is not None for key, files in targets.items()}
        self._row_trained = {key: model_rows.trained_drafter_beside(files) for key, files in targets.items() if files}
        # Best fit, then fastest; where no speed is known (a GPU, or no fit), the smallest first.
        fits.sort(key=lambda f: (FIT_ORDER.get(f.fit, 9), -(speeds[f.entry.id].tok_s if speeds[f.entry.id] else 0),
                                 f.estimate.total))
        self.rows = fits or [None]
        self.table.setRowCount(len(self.rows))
        preselect = 0
        for r, fit in enumerate(self.rows):
            for c, cell in enumerate(self._cells(fit, speeds.get(self._entry_id(fit)))):
                item = QTableWidgetItem(cell.text)
                item.setToolTip(cell.tip)
                if cell.color:
                    item.setForeground(QColor(cell.color))
                    font = QFont()
                    font.setBold(True)
                    item.setFont(font)
                self.table.setItem(r, c, item)
            if fit is not None and fit.recommended and keep is None:
                preselect = r
            if keep is not None and self._entry_id(fit) == keep:
                preselect = r
        self.table.selectRow(preselect)
        self._apply_filter(self.filter.text())
        self._sync()
        self.reveal_selection()

    def reveal_selection(self) -> None:
        """Scroll the selected row into view: the settings panel below names it, and a row chosen
        for the user (the recommendation, a model just imported, the selection kept across a re-sort)
        may sit below the table's fold."""
        row = self.table.currentRow()
        if row >= 0 and not self.table.isRowHidden(row):
            self.table.scrollTo(self.table.model().index(row, 0), QAbstractItemView.ScrollHint.EnsureVisible)

    def _hay(self, fit) -> str:
        """What the filter box searches in a row: names, repo, variant, source, drafter."""
        if fit is None:
            return "bundled offline qwen"
        local = self.local.get(fit.entry.id)
        # A local row's id is its path: folder names would match words they only contain.
        return " ".join([fit.entry.name, fit.entry.family, fit.entry.target_repo,
                         "" if local is not None else fit.entry.id, model_rows.variant_label(fit), model_rows.source_label(fit),
                         model_rows.drafter_cell(fit, local).text]).lower()

    def _apply_filter(self, text: str) -> None:
        words = text.lower().split()
        for r, fit in enumerate(self.rows):
            hay = self._hay(fit)
            self.table.setRowHidden(r, not all(w in hay for w in words))

    def select_matching(self, text: str) -> bool:
        """Select the first row whose searchable text holds ``text`` (the screenshot's --select)."""
        row = next((r for r, f in enumerate(self.rows) if text.lower() in self._hay(f)), None)
        if row is not None:
            self.table.selectRow(row)
            self.reveal_selection()
        return row is not None

    def show_offline(self, message: str) -> None:
        self.offline_notice.setText(message)
        self.offline_notice.setVisible(bool(message))

    def _installed(self, fit) -> bool:
        if fit is None:
            return "default-offline" in self.installed
        return self._row_installed.get(fit.entry.id, fit.entry.id in self.installed)

    def _cells(self, fit, speed=None) -> list[Cell]:
        if fit is None:  # catalog unavailable: still offer the bundled pair
            ready = "default-offline" in self.installed
            return [Cell("Qwen2.5-Coder 1.5B Instruct (bundled, offline)"), Cell("1.5B"), Cell("Q4_K_M"), Cell("–"),
                    Cell("–"), Cell("–"), Cell("–"), Cell("bundled"), Cell("Qwen2.5-Coder 0.5B"), Cell("–"),
                    Cell("✔" if ready else "not yet")]
        e = fit.entry
        local = self.local.get(e.id)
        label, color = FIT_LABELS.get(fit.fit, (fit.fit, None))
        name = e.name + ("  ★ recommended" if fit.recommended else "")
        # The engine's fit reason ends with a speed figure; the Speed column gives this variant's.
        reason = fit.reason.split("; ")[0]
        installed = self._installed(fit)
        where = str(local.model.path) if local is not None else e.target_repo
        model_tip = where if local is not None else (
            f"{e.target_repo} · {e.license}" + (" · gated: needs a Hugging Face login" if e.gated else ""))
        variant_tip = (f"GGUF {fit.variant}: the file's own quantized weights (precision \"file\")"
                       if getattr(fit, "gguf", None) is not None else
                       f"safetensors weights, loaded at {fit.precision}")
        return [
            Cell(name, model_tip),
            Cell(model_rows.human_params(e.target_params)),
            Cell(model_rows.variant_label(fit), variant_tip),
            Cell(*model_rows.size_text(fit)),
            model_rows.memory_cell(fit),
            Cell(label, reason, color),
            Cell(speed.text() if speed else "–", speed.source if speed else "no CPU figure: it runs on "
                 + ("the GPU" if fit.device != "cpu" else "no device here")),
            Cell(model_rows.source_label(fit), where),
            model_rows.drafter_cell(fit, local, self._row_trained.get(e.id)),
            Cell(model_rows.speedup_text(fit.predicted_speedup), "predicted from the drafter kind and the device"),
            Cell("✔" if installed else "–", "", "#188038" if installed else None),
        ]

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._sync()

    def _offer_variants(self, fit) -> None:
        """The selected model's builds in the variant combo, its current one selected."""
        hw = getattr(self.report, "hardware", None)
        self._variant_options = model_rows.variant_fits(fit, hw) if fit is not None else []
        self.variant.clear()
        for option in self._variant_options:
            speed = self.speed(option)
            self.variant.addItem(model_rows.variant_choice_label(option, speed.text() if speed else ""))
        current = next((i for i, f in enumerate(self._variant_options) if f.variant == fit.variant), 0) if fit else 0
        self.variant.setCurrentIndex(current)
        self.variant.setEnabled(len(self._variant_options) > 1)

    def _variant_chosen(self, index: int) -> None:
        fit = self.selected()
        if fit is None or not 0 <= index < len(self._variant_options):
            return
        self.variant_choice[fit.entry.id] = self._variant_options[index].variant
        self.refresh()

    def _sync(self) -> None:
        fit = self.selected()
        installed = self._installed(fit)
        runnable = fit is None or fit.fit != "none"
        self.load_button.setEnabled(not self.busy and installed and runnable and self.table.rowCount() > 0)
        self.download_button.setEnabled(not self.busy and fit is not None and not installed and not model_rows.is_local(fit)
                                        and fit.entry.id != "default-offline")
        self.add_button.setEnabled(not self.busy)
        # One obvious next step: Load when the model is here, Download when it is not.
        primary = self.load_button if installed or fit is None else self.download_button
        for button in (self.load_button, self.download_button):
            button.setDefault(button is primary)
            button.setVisible(button is primary)
            button.setStyleSheet("font-weight: 700; padding: 6px 18px;" if button is primary else "")
        self.settings_panel.show_entry(self._entry_id(fit) if self.table.rowCount() else None,
                                       fit.entry.name if fit is not None else "",
                                       fit.variant if model_rows.is_local(fit) else "")
        self._offer_variants(fit)
        if fit is not None:
            self.detail.setText(model_rows.detail_text(fit, self.local.get(fit.entry.id)))
        elif self.table.rowCount():
            self.detail.setText("The bundled pair runs without a network.")

    def _load(self) -> None:
        if self.load_button.isEnabled():
            self.load_requested.emit(self.selected())
