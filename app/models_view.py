"""Model picker: what this machine can run, with which drafter, how much memory, how much faster."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.model_settings import PRECISION_SHORT, ModelSettingsPanel, ModelSettingsStore, default_precision
from engine.models.memory_fit import FIT_ORDER, human_bytes  # torch-free; one way of writing sizes everywhere

COLUMNS = ["Model", "Parameters", "Memory needed (at load precision)", "Fit", "Speed (plain)", "Drafter", "Drafter kind",
           "Predicted speedup", "Installed"]
MEMORY, FIT, SPEED = 2, 3, 4
FIT_LABELS = {
    "gpu": ("Fits on GPU", "#188038"),
    "unified": ("Fits in unified memory", "#188038"),
    "cpu": ("Fits in RAM (CPU)", "#1a73e8"),
    "tight": ("Tight", "#b06000"),
    "none": ("Does not fit", "#d93025"),
}
KIND_LABELS = {
    "draft_model": "small draft model",
    "assistant": "MTP assistant (shares KV)",
    "mtp": "MTP heads in checkpoint",
    "lookup": "prompt lookup",
}
CONTEXTS = [2048, 4096, 8192, 16384, 32768]


def human_params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def speedup_text(value) -> str:
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return f"{value[0]:.1f}–{value[1]:.1f}×"
    return f"{value:.1f}×" if value else "–"


def hardware_text(hw) -> str:
    """One line: RAM, CPU, GPUs or Apple memory, free disk (engine.models.hardware.Hardware)."""
    if hw is None:
        return "Hardware: unknown"
    parts = [f"RAM {human_bytes(hw.ram_total)} ({human_bytes(hw.ram_available)} free)"]
    if hw.cpu_cores:  # a described machine (profile) may not say
        parts.append(f"CPU {hw.cpu_model} · {hw.cpu_cores} cores")
    for gpu in hw.gpus:
        parts.append(f"GPU {gpu.name} {human_bytes(gpu.total_bytes)} ({human_bytes(gpu.free_bytes)} free)")
    if hw.unified_memory:
        parts.append(f"Apple unified memory {human_bytes(hw.unified_memory)}")
    if not hw.gpus and not hw.unified_memory:
        parts.append("no GPU: models run on the CPU")
    if hw.disk_free is not None:
        parts.append(f"{human_bytes(hw.disk_free)} free disk")
    return " · ".join(parts)


class ModelsView(QWidget):
    load_requested = Signal(object)  # FitResult or None (the default offline pair)
    download_requested = Signal(object)  # FitResult
    context_changed = Signal(int)

    def __init__(self, store: ModelSettingsStore | None = None, parent=None) -> None:
        super().__init__(parent)
        if store is None:
            from app.app_settings import AppSettings

            store = ModelSettingsStore(AppSettings())
        self.store = store
        #: The precision a model without its own setting loads at (the demo's choice).
        self.app_precision = "fast"
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
        self.filter.setPlaceholderText("Filter models by name, family or repository…")
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
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        outer.addWidget(self.table, 1)
        self.settings_panel = ModelSettingsPanel(store)
        outer.addWidget(self.settings_panel)

        self.detail = QLabel("")
        self.detail.setWordWrap(True)
        self.detail.setStyleSheet("color: #444;")
        buttons = QHBoxLayout()
        self.download_button = QPushButton("Download")
        self.load_button = QPushButton("Load")
        for button in (self.download_button, self.load_button):
            button.setMinimumWidth(120)
        buttons.addWidget(self.detail, 1)
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.load_button)
        outer.addLayout(buttons)

        self.rows: list = []  # FitResult per row, None for a bare default-pair row
        self.installed: frozenset[str] = frozenset()
        self.busy = False
        self.table.itemSelectionChanged.connect(self._sync)
        self.table.cellDoubleClicked.connect(lambda *_: self._load())
        self.load_button.clicked.connect(self._load)
        self.download_button.clicked.connect(lambda: self.selected() and self.download_requested.emit(self.selected()))
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
        self.hardware.setText(hardware_text(report.hardware) + (f"\n⚠ {report.error}" if report.error else ""))
        self.installed = report.installed | ({"default-offline"} if report.default_pair_ready else frozenset())
        self.refresh()

    def set_app_precision(self, precision: str) -> None:
        if precision != self.app_precision:
            self.app_precision = precision
            self.refresh()

    def load_precision(self, entry_id: str) -> str:
        """The app's precision name ("file", "fast", "exact", "int8", "int4") this model loads at:
        its own setting; else its own default (the default pair: as in its GGUF file); else 4-bit
        where the fit chose it (16-bit does not fit the GPU); else the app's."""
        own = self.store.get(entry_id).precision or default_precision(entry_id)
        if own:
            return own
        chosen = next((f.precision for f in getattr(self.report, "fits", ()) if f.entry.id == entry_id), None)
        return "int4" if chosen == "int4" else self.app_precision

    def _reassess(self, fit):
        """The fit at the precision (and context) this model will load at: its own settings."""
        hw = getattr(self.report, "hardware", None)
        precision = self.load_precision(fit.entry.id)
        context = self.store.get(fit.entry.id).context or fit.context
        # "file" (a GGUF file's own blocks) has no memory-fit name yet: its row keeps the fit's precision.
        short = PRECISION_SHORT.get(precision, fit.precision)
        precision = precision if precision in PRECISION_SHORT else fit.precision
        if hw is None or (short == fit.precision and context == fit.context):
            return fit
        from dataclasses import replace

        from engine.models.fit import assess

        result = assess(fit.entry, hw, precision, context)
        return replace(result, recommended=fit.recommended and result.fit != "none")

    def speed(self, fit):
        """engine.models.decode_speed.SpeedHint for a CPU fit, else None."""
        hw = getattr(self.report, "hardware", None)
        if hw is None or fit.device != "cpu" or fit.fit == "none":
            return None
        from engine.models.decode_speed import predict_plain_rate

        return predict_plain_rate(hw, fit.estimate.weights, fit.precision)

    def refresh(self) -> None:
        """Rebuild the rows from the last report: each model at its load precision, best fit
        first, then the fastest expected."""
        if self.report is None:
            return
        keep = self._entry_id(self.selected()) if self.table.currentRow() >= 0 else None
        fits = [self._reassess(f) for f in self.report.fits]
        speeds = {f.entry.id: self.speed(f) for f in fits}
        # Best fit, then fastest; where no speed is known (a GPU, or no fit), the smallest first.
        fits.sort(key=lambda f: (FIT_ORDER.get(f.fit, 9), -(speeds[f.entry.id].tok_s if speeds[f.entry.id] else 0),
                                 f.estimate.total))
        self.rows = fits or [None]
        self.table.setRowCount(len(self.rows))
        preselect = 0
        for r, fit in enumerate(self.rows):
            for c, (text, tip, color) in enumerate(self._cells(fit, speeds.get(self._entry_id(fit)))):
                item = QTableWidgetItem(text)
                item.setToolTip(tip)
                if color:
                    item.setForeground(QColor(color))
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

    def _apply_filter(self, text: str) -> None:
        words = text.lower().split()
        for r, fit in enumerate(self.rows):
            hay = "bundled offline qwen" if fit is None else " ".join(
                [fit.entry.name, fit.entry.family, fit.entry.target_repo, fit.entry.id]).lower()
            self.table.setRowHidden(r, not all(w in hay for w in words))

    def show_offline(self, message: str) -> None:
        self.offline_notice.setText(message)
        self.offline_notice.setVisible(bool(message))

    def _cells(self, fit, speed=None):
        if fit is None:  # catalog unavailable: still offer the bundled pair
            ready = "default-offline" in self.installed
            return [("Qwen2.5-Coder 1.5B Instruct (bundled, offline)", "", None), ("1.5B", "", None), ("–", "", None),
                    ("–", "", None), ("–", "", None), ("Qwen2.5-Coder 0.5B", "", None), (KIND_LABELS["draft_model"], "", None),
                    ("–", "", None), ("✔" if ready else "not yet", "", None)]
        e = fit.entry
        label, color = FIT_LABELS.get(fit.fit, (fit.fit, None))
        name = e.name + ("  ★ recommended" if fit.recommended else "")
        est = fit.estimate
        # The engine's fit reason ends with a speed figure from one 16-bit bandwidth constant;
        # the Speed column gives the figure for this model's own precision instead.
        reason = fit.reason.split("; ")[0]
        breakdown = (f"weights {human_bytes(est.weights)} + KV cache {human_bytes(est.kv_cache)} + drafter "
                     f"{human_bytes(est.drafter)} + runtime {human_bytes(est.overhead)} at {fit.context} tokens, {fit.precision}")
        drafter = e.drafter_repo.split("/")[-1] if e.drafter_repo else "prompt lookup"
        installed = e.id in self.installed
        return [
            (name, f"{e.target_repo} · {e.license}" + (" · gated: needs a Hugging Face login" if e.gated else ""), None),
            (human_params(e.target_params), "", None),
            (f"{fit.precision} · {human_bytes(est.total)}", breakdown, None),
            (label, reason, color),
            (speed.text() if speed else "–", speed.source if speed else "no CPU figure: it runs on "
             + ("the GPU" if fit.device != "cpu" else "no device here"), None),
            (drafter, e.drafter_repo or "n-gram lookup in the prompt and reply; no extra model", None),
            (KIND_LABELS.get(e.drafter_kind, e.drafter_kind), "", None),
            (speedup_text(fit.predicted_speedup), "predicted from the drafter kind and the device", None),
            ("✔" if installed else "–", "", "#188038" if installed else None),
        ]

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._sync()

    def _sync(self) -> None:
        fit = self.selected()
        installed = self._entry_id(fit) in self.installed
        runnable = fit is None or fit.fit != "none"
        self.load_button.setEnabled(not self.busy and installed and runnable and self.table.rowCount() > 0)
        self.download_button.setEnabled(not self.busy and fit is not None and not installed and fit.entry.id != "default-offline")
        # One obvious next step: Load when the model is here, Download when it is not.
        primary = self.load_button if installed or fit is None else self.download_button
        for button in (self.load_button, self.download_button):
            button.setDefault(button is primary)
            button.setVisible(button is primary)
            button.setStyleSheet("font-weight: 700; padding: 6px 18px;" if button is primary else "")
        self.settings_panel.show_entry(self._entry_id(fit) if self.table.rowCount() else None,
                                       fit.entry.name if fit is not None else "")
        if fit is not None:
            self.detail.setText(f"{fit.entry.name}: {fit.reason.split('; ')[0]}")
        elif self.table.rowCount():
            self.detail.setText("The bundled pair runs without a network.")

    def _load(self) -> None:
        if self.load_button.isEnabled():
            self.load_requested.emit(self.selected())
