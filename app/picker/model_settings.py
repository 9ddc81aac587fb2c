"""Per-model settings (precision, context, drafter, draft length, threads), kept across restarts.

Stored in QSettings under ``models/<entry id>/<field>``: one enum names the fields, as
app/store/app_settings.py names the app's keys. A field left unset follows the app-wide choice (the
demo's precision, the picker's context, the demo's drafter)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QGridLayout, QGroupBox, QLabel, QPushButton, QSpinBox

from engine.core.settings import PRECISION_ALIASES

FOLLOW_APP = ("Follow the app (demo's choice)", "")
DEFAULT_PAIR = "default-offline"
DRAFTERS = [("Draft model", "model"), ("Trained here (EAGLE-3)", "trained"), ("Prompt lookup", "lookup"),
            ("Off (plain decoding)", "off")]
CONTEXTS = [0, 2048, 4096, 8192, 16384, 32768]
# The ids of GGUF files found on this machine (engine.library.fit_rows.LOCAL_ID_PREFIX, which
# imports torch: not on the GUI thread).
LOCAL_ID_PREFIX = "local:"


def is_local_file(entry_id: str | None) -> bool:
    return bool(entry_id) and entry_id.startswith(LOCAL_ID_PREFIX)


def precision_choices(entry_id: str | None, quantization: str = "") -> list[tuple[str, str]]:
    """(label, precision) pairs the precision combo offers for a model, named by the engine
    (engine.models.planning.precision_labels): the default pair came from a GGUF file, so its own
    quantization comes first ("As in the file (Q4_K_M)", its default) and the others say they
    dequantize or re-quantize it (from its converted folder); a GGUF file found on this machine
    runs as the file alone (a .gguf target loads at precision "file" only: engine.models.loading.loader,
    and no converted folder stands for it), ``quantization`` naming it ("Q4_0"); any other
    model follows the app's choice unless told otherwise."""
    from engine.models.planning.precision_labels import choices

    if entry_id == DEFAULT_PAIR:
        return choices(default_pair_quantization(), with_file=True)
    if is_local_file(entry_id):
        return choices(quantization, with_file=True)[:1]
    return [FOLLOW_APP, *choices(None)]


def default_pair_quantization() -> str:
    """The default target's GGUF quantization ("Q4_K_M"), from its conversion record: a JSON read,
    no torch (the worker records it when it prepares the pair); "" until it is known."""
    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair
    from engine.models.loading.file_precision import source_quantization

    return source_quantization(cache_dir() / "models" / default_pair.TARGET.name, open_file=False) or ""


def default_precision(entry_id: str | None) -> str:
    """What a model with no precision of its own loads at: the default pair, its default
    (engine.models.loading.default_pair.DEFAULT_PRECISION); a GGUF file on this machine, the file's own
    ("file"); any other model, "" (the app's choice)."""
    if is_local_file(entry_id):
        return "file"
    if entry_id == DEFAULT_PAIR:
        from engine.models.loading import default_pair

        return default_pair.DEFAULT_PRECISION
    return ""


class Field(str, Enum):
    PRECISION = "precision"
    CONTEXT = "context"
    DRAFTER = "drafter"
    DRAFT_LENGTH = "draft_length"
    THREADS = "threads"
    KEEP_IN_RAM = "keep_in_ram"


@dataclass(frozen=True)
class ModelSettings:
    """``precision`` "" = the app's; ``context`` 0 = the picker's; ``draft_length`` 0 = auto;
    ``threads`` 0 = the engine's default (all physical cores). ``keep_in_ram``: lock a GGUF
    model's memory-mapped weights in RAM, or copy them into the process's own memory where the
    lock limit forbids it (engine.gguf.resident), so other programs' memory use cannot push them out."""

    precision: str = ""
    context: int = 0
    drafter: str = "model"
    draft_length: int = 0
    threads: int = 0
    keep_in_ram: bool = False

    def resolved_precision(self, app_precision: str) -> str:
        return self.precision or app_precision


class ModelSettingsStore:
    def __init__(self, app_settings) -> None:
        self.q = app_settings.q

    def _key(self, entry_id: str, field: Field) -> str:
        return f"models/{entry_id}/{field.value}"

    def get(self, entry_id: str) -> ModelSettings:
        d = ModelSettings()

        def read(field: Field, default, kind):
            try:
                return kind(self.q.value(self._key(entry_id, field), default))
            except (TypeError, ValueError):
                return default

        drafter = read(Field.DRAFTER, d.drafter, str)
        precision = read(Field.PRECISION, d.precision, str)
        precision = PRECISION_ALIASES.get(precision, precision)  # saved under an older name
        known = {p for _, p in precision_choices(entry_id)}
        return ModelSettings(
            precision=precision if precision and precision in known else "",
            context=max(0, read(Field.CONTEXT, d.context, int)),
            drafter=drafter if drafter in {k for _, k in DRAFTERS} else d.drafter,
            draft_length=min(8, max(0, read(Field.DRAFT_LENGTH, d.draft_length, int))),
            threads=max(0, read(Field.THREADS, d.threads, int)),
            # QSettings' ini files hold booleans as the words "true" / "false".
            keep_in_ram=read(Field.KEEP_IN_RAM, d.keep_in_ram, lambda v: str(v).lower() in ("true", "1")),
        )

    def set(self, entry_id: str, settings: ModelSettings) -> None:
        for field in Field:
            self.q.setValue(self._key(entry_id, field), getattr(settings, field.value))
        self.q.sync()


class ModelSettingsPanel(QGroupBox):
    """The selected model's settings, inline under the picker; every edit is saved at once."""

    changed = Signal(str, object)  # entry id, ModelSettings

    def __init__(self, store: ModelSettingsStore, parent=None) -> None:
        super().__init__("Settings for the selected model", parent)
        self.store = store
        self.entry_id: str | None = None
        grid = QGridLayout(self)  # one row of captioned fields: the table keeps the height
        self.precision = QComboBox()
        self._offer_precisions(None)
        self.precision.setToolTip("The precision this model loads at; memory, fit and speed above follow it.\n"
                                  "As in the file: the GGUF file's own quantized weights, computed as they are.\n"
                                  "dequantized: the file's values widened to bf16 / fp32 (same values, more memory).\n"
                                  "re-quantized: Tandem rounds the file's values again to int8 / int4 (a second rounding:\n"
                                  "the output moves further from the file's own model).")
        self.context = QComboBox()
        for n in CONTEXTS:
            self.context.addItem(f"{n // 1024}k tokens" if n else "Picker's context", n)
        self.drafter = QComboBox()
        for label, value in DRAFTERS:
            self.drafter.addItem(label, value)
        self.draft_length = QSpinBox()
        self.draft_length.setRange(0, 8)
        self.draft_length.setSpecialValueText("Auto")
        self.threads = QSpinBox()
        self.threads.setRange(0, 256)
        self.threads.setSpecialValueText("All cores")
        self.keep_in_ram = QCheckBox("Keep in RAM")
        self.keep_in_ram.setToolTip("Lock a GGUF model's weights in memory (as llama.cpp's --mlock), so that other\n"
                                    "programs' memory use cannot push them out to be read from disk at every step.\n"
                                    "Where the system's locked-memory limit is too small, the weights are copied into\n"
                                    "Tandem's own memory instead; you are told which, or why neither could be done.")
        self.reset = QPushButton("Reset to defaults")
        for col, (label, widget) in enumerate([("Precision", self.precision), ("Context length", self.context),
                                               ("Drafter", self.drafter), ("Draft length", self.draft_length),
                                               ("Threads", self.threads), ("Memory", self.keep_in_ram),
                                               ("", self.reset)]):
            caption = QLabel(label)
            caption.setStyleSheet("color: #555; font-size: 11px;")
            grid.addWidget(caption, 0, col)
            grid.addWidget(widget, 1, col)
        grid.setColumnStretch(0, 2)
        grid.setColumnStretch(2, 1)
        for combo in (self.precision, self.context, self.drafter):
            combo.activated.connect(lambda _: self._save())
        for spin in (self.draft_length, self.threads):
            spin.valueChanged.connect(lambda _: self._save())
        self.keep_in_ram.toggled.connect(lambda _: self._save())
        self.reset.clicked.connect(self._reset)
        self.setEnabled(False)

    def show_entry(self, entry_id: str | None, name: str = "", quantization: str = "") -> None:
        """Show ``entry_id``'s settings; ``quantization``: the GGUF file's ("Q4_0") when the
        row is a file on this machine, for its one precision's label."""
        self.entry_id = None  # no saving while the widgets are filled in
        self.setTitle(f"Settings for {name}" if name else "Settings for the selected model")
        self.setEnabled(entry_id is not None)
        s = self.store.get(entry_id) if entry_id else ModelSettings()
        self._offer_precisions(entry_id, quantization)
        self.precision.setCurrentIndex(max(0, self.precision.findData(s.precision or default_precision(entry_id))))
        self.context.setCurrentIndex(max(0, self.context.findData(s.context)))
        self.drafter.setCurrentIndex(max(0, self.drafter.findData(s.drafter)))
        self.draft_length.setValue(s.draft_length)
        self.threads.setValue(s.threads)
        self.keep_in_ram.setChecked(s.keep_in_ram)
        self.entry_id = entry_id

    def _offer_precisions(self, entry_id: str | None, quantization: str = "") -> None:
        wanted = precision_choices(entry_id, quantization)
        have = [(self.precision.itemText(i), self.precision.itemData(i)) for i in range(self.precision.count())]
        if have != wanted:
            self.precision.clear()
            for label, value in wanted:
                self.precision.addItem(label, value)
        self.precision.setEnabled(len(wanted) > 1)  # one way to run it: nothing to choose

    def value(self) -> ModelSettings:
        return ModelSettings(self.precision.currentData(), self.context.currentData(), self.drafter.currentData(),
                             self.draft_length.value(), self.threads.value(), self.keep_in_ram.isChecked())

    def _save(self) -> None:
        if self.entry_id is None:
            return
        settings = self.value()
        self.store.set(self.entry_id, settings)
        self.changed.emit(self.entry_id, settings)

    def _reset(self) -> None:
        entry = self.entry_id
        if entry is not None:
            self.store.set(entry, ModelSettings())
            self.show_entry(entry)
            self.changed.emit(entry, ModelSettings())


__all__ = ["Field", "ModelSettings", "ModelSettingsPanel", "ModelSettingsStore"]
