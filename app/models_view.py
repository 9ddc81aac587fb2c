"""Model picker: what this machine can run, with which drafter, how much memory, how much faster."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.models.memory_fit import human_bytes  # torch-free; one way of writing sizes everywhere

COLUMNS = ["Model", "Parameters", "Memory needed", "Fit", "Drafter", "Drafter kind", "Predicted speedup", "Installed"]
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

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
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

        self.detail = QLabel("")
        self.detail.setWordWrap(True)
        self.detail.setStyleSheet("color: #444;")
        buttons = QHBoxLayout()
        self.download_button = QPushButton("Download")
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
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
        self._sync()

    def set_context(self, n: int) -> None:
        self.context.setCurrentIndex(max(0, self.context.findData(n)))

    def selected(self):
        row = self.table.currentRow()
        return self.rows[row] if 0 <= row < len(self.rows) else None

    def _entry_id(self, fit) -> str:
        return fit.entry.id if fit is not None else "default-offline"

    def show_report(self, report) -> None:
        self.hardware.setText(hardware_text(report.hardware) + (f"\n⚠ {report.error}" if report.error else ""))
        self.installed = report.installed | ({"default-offline"} if report.default_pair_ready else frozenset())
        keep = self._entry_id(self.selected()) if self.table.currentRow() >= 0 else None
        self.rows = list(report.fits) or [None]
        self.table.setRowCount(len(self.rows))
        preselect = 0
        for r, fit in enumerate(self.rows):
            for c, (text, tip, color) in enumerate(self._cells(fit)):
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
        self._sync()

    def _cells(self, fit):
        if fit is None:  # catalog unavailable: still offer the bundled pair
            ready = "default-offline" in self.installed
            return [("Qwen2.5-Coder 1.5B Instruct (bundled, offline)", "", None), ("1.5B", "", None), ("–", "", None),
                    ("–", "", None), ("Qwen2.5-Coder 0.5B", "", None), (KIND_LABELS["draft_model"], "", None),
                    ("–", "", None), ("✔" if ready else "not yet", "", None)]
        e = fit.entry
        label, color = FIT_LABELS.get(fit.fit, (fit.fit, None))
        name = e.name + ("  ★ recommended" if fit.recommended else "")
        est = fit.estimate
        breakdown = (f"weights {human_bytes(est.weights)} + KV cache {human_bytes(est.kv_cache)} + drafter "
                     f"{human_bytes(est.drafter)} + runtime {human_bytes(est.overhead)} at {fit.context} tokens, {fit.precision}")
        drafter = e.drafter_repo.split("/")[-1] if e.drafter_repo else "prompt lookup"
        installed = e.id in self.installed
        return [
            (name, f"{e.target_repo} · {e.license}" + (" · gated: needs a Hugging Face login" if e.gated else ""), None),
            (human_params(e.target_params), "", None),
            (human_bytes(est.total), breakdown, None),
            (label, fit.reason, color),
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
        if fit is not None:
            self.detail.setText(f"{fit.entry.name}: {fit.reason}")
        elif self.table.rowCount():
            self.detail.setText("The bundled pair runs without a network.")

    def _load(self) -> None:
        if self.load_button.isEnabled():
            self.load_requested.emit(self.selected())
