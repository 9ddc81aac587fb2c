"""The chat's settings: a preset picker, and a collapsible panel with the system prompt, sampling
and speculation choices. Reads and writes app.store.presets.Preset, so what the panel shows is exactly
what a preset file holds."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.store.presets import Preset, PresetStore

DEFAULT = Preset(name="Default")
CHAT_DRAFTERS = [("Draft model", "model"), ("Prompt lookup", "lookup"), ("Off", "off")]
CUSTOM = "Custom"  # the combo's label once a value no longer matches the chosen preset
REPLY_FORMAT_ITEMS = [("Text", "text"), ("JSON", "json"), ("JSON schema", "json_schema")]
SCHEMA_EXAMPLE = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'


def _caption(text: str) -> QLabel:
    label = QLabel(text)
    label.setStyleSheet("color: #555; font-size: 11px;")
    return label


class ChatSettingsPanel(QWidget):
    #: The system prompt box changed (the view stores it with the current conversation).
    system_prompt_edited = Signal(str)
    #: A preset was saved (its file path).
    preset_saved = Signal(object)

    def __init__(self, store: PresetStore, parent=None) -> None:
        super().__init__(parent)
        self.store = store
        self.presets: list[Preset] = []
        self._applying = False

        self.preset = QComboBox()
        self.preset.setMinimumWidth(140)
        self.preset.setToolTip(f"Presets are JSON files in {store.directory}: copy, edit or share them.")
        self.save_button = QPushButton("Save as preset…")
        self.tools_button = QPushButton("Tools…")  # the view opens app.chat.tools_dialog with it
        self.toggle = QToolButton()
        self.toggle.setCheckable(True)
        self.toggle.setText("Settings ▸")
        self.toggle.setAutoRaise(True)
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(_caption("Preset"))
        head.addWidget(self.preset)
        head.addWidget(self.save_button)
        head.addStretch(1)
        head.addWidget(self.tools_button)
        head.addWidget(self.toggle)

        self.body = QWidget()
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("System prompt for this chat (optional): how the assistant should behave")
        self.system_prompt.setFixedHeight(64)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setSpecialValueText("0 (greedy)")
        self.temperature.setToolTip("0 picks the most likely token every time; above 0 the reply is sampled.")
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.05, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setSpecialValueText("Off")
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 32768)
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.seed.setToolTip("The same seed and settings repeat a sampled reply.")
        self.drafter = QComboBox()
        for label, kind in CHAT_DRAFTERS:
            self.drafter.addItem(label, kind)
        self.drafter.setToolTip("Who drafts tokens for the model to check. The reply is the same either way; only the speed differs.")
        self.draft_length = QSpinBox()
        self.draft_length.setRange(0, 16)
        self.draft_length.setSpecialValueText("Auto")
        self.draft_length.setToolTip("Tokens drafted per step; Auto picks it from measured costs and acceptance.")
        self.reply_format = QComboBox()
        for label, kind in REPLY_FORMAT_ITEMS:
            self.reply_format.addItem(label, kind)
        self.reply_format.setToolTip("JSON: every reply is one JSON object. JSON schema: every reply is JSON that "
                                     "follows the schema below. Decoding is held to it token by token; "
                                     "speculation still gives the same reply as the model alone.")
        self.json_schema = QPlainTextEdit()
        self.json_schema.setPlaceholderText(f"A JSON schema, for example {SCHEMA_EXAMPLE}")
        self.json_schema.setFixedHeight(72)
        self.schema_problem = QLabel("")
        self.schema_problem.setStyleSheet("color: #c5221f; font-size: 11px;")
        self.ctrl_enter = QCheckBox("Ctrl+Enter sends (Enter makes a new line)")
        grid = QGridLayout()
        grid.setContentsMargins(0, 0, 0, 0)
        for col, (label, widget) in enumerate([
            ("Temperature", self.temperature), ("Top-p", self.top_p), ("Top-k", self.top_k),
            ("Max tokens", self.max_new_tokens), ("Seed", self.seed), ("Drafter", self.drafter),
            ("Draft length", self.draft_length), ("Reply format", self.reply_format),
        ]):
            grid.addWidget(_caption(label), 0, col)
            grid.addWidget(widget, 1, col)
        body_col = QVBoxLayout(self.body)
        body_col.setContentsMargins(0, 0, 0, 0)
        body_col.addWidget(_caption("System prompt"))
        body_col.addWidget(self.system_prompt)
        body_col.addLayout(grid)
        self.schema_caption = _caption("JSON schema")
        for w in (self.schema_caption, self.json_schema, self.schema_problem):
            body_col.addWidget(w)
        body_col.addWidget(self.ctrl_enter)
        self.body.hide()

        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addLayout(head)
        col.addWidget(self.body)

        self.toggle.toggled.connect(self.set_expanded)
        self.preset.activated.connect(self._preset_chosen)
        self.save_button.clicked.connect(self._ask_and_save)
        self.system_prompt.textChanged.connect(self._system_prompt_changed)
        for spin in (self.temperature, self.top_p, self.top_k, self.max_new_tokens, self.seed, self.draft_length):
            spin.valueChanged.connect(self.sync_preset_name)
        self.drafter.currentIndexChanged.connect(self.sync_preset_name)
        self.reply_format.currentIndexChanged.connect(self.sync_preset_name)
        self.reply_format.currentIndexChanged.connect(self._sync_schema)
        self.json_schema.textChanged.connect(self.sync_preset_name)
        self.json_schema.textChanged.connect(self._sync_schema)
        self.temperature.valueChanged.connect(self._sync_sampling)
        self.reload()
        self.apply(DEFAULT)

    # --- presets ------------------------------------------------------------------------------
    def reload(self, select: str | None = None) -> None:
        """Read the preset files again; keep (or switch to) ``select`` when it exists."""
        current = select or self.preset.currentText()
        self.presets = [DEFAULT] + [p for p in self.store.load_all() if p.name != DEFAULT.name]
        self.preset.blockSignals(True)
        self.preset.clear()
        for p in self.presets:
            self.preset.addItem(p.name)
        index = self.preset.findText(current)
        if index < 0:
            self.preset.addItem(CUSTOM)
            index = self.preset.count() - 1
        self.preset.setCurrentIndex(index)
        self.preset.blockSignals(False)

    def find(self, name: str) -> Preset | None:
        return next((p for p in self.presets if p.name == name), None)

    def _preset_chosen(self, index: int) -> None:
        preset = self.find(self.preset.itemText(index))
        if preset is not None:
            self.apply(preset)

    def apply(self, preset: Preset, with_system_prompt: bool = True) -> None:
        self._applying = True
        try:
            if with_system_prompt:
                self.system_prompt.setPlainText(preset.system_prompt)
            self.temperature.setValue(preset.temperature)
            self.top_p.setValue(preset.top_p)
            self.top_k.setValue(preset.top_k)
            self.max_new_tokens.setValue(preset.max_new_tokens)
            self.seed.setValue(preset.seed)
            # A fixed length of 0 never drafts: the same as drafting off.
            drafter = "off" if preset.draft_length == 0 else preset.drafter
            self.drafter.setCurrentIndex(max(0, self.drafter.findData(drafter)))
            self.draft_length.setValue(preset.draft_length or 0)
            self.reply_format.setCurrentIndex(max(0, self.reply_format.findData(preset.reply_format)))
            self.json_schema.setPlainText(preset.json_schema)
        finally:
            self._applying = False
        self._select_name(preset.name)
        self._sync_sampling()
        self._sync_schema()
        if with_system_prompt:
            self.system_prompt_edited.emit(preset.system_prompt)  # the current chat takes it

    def current(self, name: str | None = None) -> Preset:
        """The panel's values as a preset (named after the chosen one unless ``name`` is given)."""
        k = self.draft_length.value()
        return Preset(
            name=name or self.preset.currentText(),
            system_prompt=self.system_prompt.toPlainText(),
            temperature=round(self.temperature.value(), 4),
            top_p=round(self.top_p.value(), 4),
            top_k=self.top_k.value(),
            max_new_tokens=self.max_new_tokens.value(),
            seed=self.seed.value(),
            drafter=self.drafter.currentData(),
            draft_length=k or None,
            reply_format=self.reply_format.currentData(),
            json_schema=self.json_schema.toPlainText(),
        )

    def save_as(self, name: str) -> Preset:
        preset = self.current(name.strip())
        path = self.store.save(preset)
        self.reload(select=preset.name)
        self.preset_saved.emit(path)
        return preset

    def _ask_and_save(self) -> None:
        name, ok = QInputDialog.getText(self, "Save as preset", "Preset name:", text=self._suggested_name())
        if ok and name.strip():
            self.save_as(name)

    def _suggested_name(self) -> str:
        name = self.preset.currentText()
        return "" if name in (CUSTOM, DEFAULT.name) else name

    # --- edits --------------------------------------------------------------------------------
    def set_expanded(self, expanded: bool) -> None:
        self.toggle.blockSignals(True)
        self.toggle.setChecked(expanded)
        self.toggle.blockSignals(False)
        self.toggle.setText("Settings ▾" if expanded else "Settings ▸")
        self.body.setVisible(expanded)

    def show_system_prompt(self, text: str) -> None:
        """Show the chosen conversation's own system prompt (not an edit)."""
        self._applying = True
        try:
            self.system_prompt.setPlainText(text)
        finally:
            self._applying = False
        self.sync_preset_name()

    def _system_prompt_changed(self) -> None:
        if not self._applying:
            self.system_prompt_edited.emit(self.system_prompt.toPlainText())
            self.sync_preset_name()

    def sync_preset_name(self, *_args) -> None:
        """Name the chosen preset while the values are still its own, else Custom."""
        if self._applying:
            return
        chosen = self.find(self.preset.currentText())
        # Still the chosen preset when only the system prompt belongs to another chat.
        if chosen is None or self.current(chosen.name) != chosen:
            self._select_name(CUSTOM if chosen is None or self._differs_beyond_prompt(chosen) else chosen.name)

    def _differs_beyond_prompt(self, preset: Preset) -> bool:
        mine = self.current(preset.name)
        return Preset(**{**mine.to_json(), "system_prompt": preset.system_prompt}) != preset

    def _select_name(self, name: str) -> None:
        self.preset.blockSignals(True)
        index = self.preset.findText(name)
        custom = self.preset.findText(CUSTOM)
        if index < 0:
            self.preset.addItem(name)
            index = self.preset.count() - 1
        self.preset.setCurrentIndex(index)
        if name != CUSTOM and custom >= 0:
            self.preset.removeItem(custom)
        self.preset.blockSignals(False)

    def _sync_schema(self, *_args) -> None:
        """The schema box shows for the JSON schema format, and says at once what is wrong."""
        wanted = self.reply_format.currentData() == "json_schema"
        for w in (self.schema_caption, self.json_schema, self.schema_problem):
            w.setVisible(wanted)
        problem = ""
        if wanted:
            try:
                self.current().output_format()
            except ValueError as exc:  # InvalidRequest
                problem = str(exc)
        self.schema_problem.setText(problem)

    def _sync_sampling(self) -> None:
        sampling = self.temperature.value() > 0
        for widget in (self.top_p, self.top_k, self.seed):
            widget.setEnabled(sampling)
