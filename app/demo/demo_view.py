"""Side-by-side demo: one prompt, with and without speculation, streaming live in two panes."""
from __future__ import annotations

import json

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.demo.plots import PLAIN_COLOR, SPEC_COLOR, AcceptancePlot, SpeedPlot
from app.demo.stream_pane import DRAFT_BACKGROUND, StreamPane
from app.widgets.reply_stats import describe
from engine.core.events import Failed, Finished, Stats, Tokens
from engine.core.paths import RESOURCES
from engine.core.settings import DecodeSettings
from engine.models.planning.precision_labels import choices

DRAFTERS = [("Draft model", "model"), ("MTP layers", "mtp"), ("Prompt lookup", "lookup"), ("Off", "off"),
            ("Drafter vs draft model", "race")]
DRAFTER_TIPS = {
    "model": "A separate small model (or a Gemma 4 assistant) drafts; the target checks its guesses.",
    "race": ("Both panes speculate: the left with the separate draft model, the right with the drafter made for this "
             "model (EAGLE-3 or DFlash, or the one trained here). Same output; which is faster here?"),
    "mtp": "The target's own multi-token-prediction layers draft.",
    "lookup": "Drafts by copying what followed the same words earlier in the prompt: free, best on edits.",
    "off": "No speculation: plain decoding.",
}
#: How often the live charts redraw while a run streams.
CHART_REFRESH_MS = 400
#: How often streamed text and the running figures are shown: still reads as streaming.
TEXT_FLUSH_MS = 100
LANE_TITLES = ("Without speculation", "With speculation")
FAIRNESS_NOTE = (
    "Both runs share this machine fairly: they take turns, and the one that has used less compute "
    "always goes next, so each pane moves at its true speed and shows its solo tokens/sec."
)


def example_prompts() -> list[tuple[str, str]]:
    rows = []
    for line in (RESOURCES / "prompts" / "bench.jsonl").read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            rows.append((f"{item['category']}: {item['prompt'][:60]}…", item["prompt"]))
    return rows


class DecodeControls(QWidget):
    """Drafter, draft length, greedy/sampling, precision, max new tokens: shared by the demo and
    (in part) the chat."""

    precision_changed = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        self.drafter = QComboBox()
        for label, kind in DRAFTERS:
            self.drafter.addItem(label, kind)
            self.drafter.setItemData(self.drafter.count() - 1, DRAFTER_TIPS[kind], Qt.ItemDataRole.ToolTipRole)
        self.draft_length = QSpinBox()
        self.draft_length.setRange(0, 8)
        self.draft_length.setSpecialValueText("Auto")  # 0 shows as Auto: adaptive k
        self.draft_length.setToolTip("Tokens drafted per step. Auto picks k from measured costs and acceptance.")
        self.mode = QComboBox()
        self.mode.addItem("Greedy", "greedy")
        self.mode.addItem("Sampling", "sample")
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.05, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setValue(0.7)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.05, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(0.95)
        self.precision = QComboBox()
        # Until a model loads: the plain precisions (app.shell.window_precision refills the combo
        # with the loaded model's, named for where its weights came from).
        for label, value in choices(None):
            self.precision.addItem(label, value)
        self.precision.setToolTip(
            "fp32: speculation is token-identical to plain decoding.\n"
            "bf16: half the memory; on a CPU with the compiled kernels speculation is token-identical here too\n"
            "(elsewhere a multi-token check can flip a near-tie: any difference is shown and explained).\n"
            "int8: the weights rounded to 8 bits (half of bf16's memory, faster on a CPU). This changes\n"
            "the model's output slightly compared with bf16; speculation on top of it stays token-identical to\n"
            "plain decoding of the same quantized model. The first load converts the weights (once, then cached).\n"
            "int4: 4-bit weights, and each layer rounds its inputs to int8 (llama.cpp's Q4 recipe): about a\n"
            "third of bf16's memory and the fastest on a CPU, with output further from bf16 than int8's."
        )
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 4096)
        self.max_new_tokens.setValue(128)
        for col, (label, widget) in enumerate([
            ("Drafter", self.drafter), ("Draft length", self.draft_length), ("Decoding", self.mode),
            ("Temperature", self.temperature), ("Top-p", self.top_p), ("Precision", self.precision),
            ("Max new tokens", self.max_new_tokens),
        ]):
            caption = QLabel(label)
            caption.setStyleSheet("color: #555; font-size: 11px;")
            grid.addWidget(caption, 0, col)
            grid.addWidget(widget, 1, col)
        self.mode.currentIndexChanged.connect(self._sync_sampling)
        self.precision.activated.connect(lambda _: self.precision_changed.emit(self.precision.currentData()))
        self._sync_sampling()

    def _sync_sampling(self) -> None:
        sampling = self.mode.currentData() == "sample"
        self.temperature.setEnabled(sampling)
        self.top_p.setEnabled(sampling)

    def settings(self) -> DecodeSettings:
        k = self.draft_length.value()
        return DecodeSettings(
            mode=self.mode.currentData(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            max_new_tokens=self.max_new_tokens.value(),
            draft_length=None if k == 0 else k,
        )

    def drafter_kind(self) -> str:
        return self.drafter.currentData()

    def offer_drafter(self, loaded_kind: str, race: bool = False) -> None:
        """Enable the drafters the loaded model has ("model" or "mtp" plus the always-available
        ones; "race" where a draft model is loaded beside a drafter made for the target) and
        switch to the loaded one when the current choice is not on offer."""
        available = {loaded_kind, "lookup", "off"} | ({"race"} if race else set())
        items = self.drafter.model()
        for row in range(self.drafter.count()):
            items.item(row).setEnabled(self.drafter.itemData(row) in available)
        if self.drafter_kind() not in available:
            self.drafter.setCurrentIndex(self.drafter.findData(loaded_kind))

    def set_precision(self, precision: str) -> None:
        self.precision.setCurrentIndex(max(0, self.precision.findData(precision)))


def _stat(title: str) -> tuple[QWidget, QLabel, QLabel]:
    """A stat box: (the box, its caption, its value)."""
    box = QFrame()
    box.setObjectName("stat")
    layout = QVBoxLayout(box)
    layout.setContentsMargins(10, 6, 10, 6)
    caption = QLabel(title)
    caption.setStyleSheet("color: #666; font-size: 11px;")
    value = QLabel("–")
    value.setStyleSheet("font-size: 17px; font-weight: 600;")
    layout.addWidget(caption)
    layout.addWidget(value)
    return box, caption, value


class LaneHeader(QWidget):
    def __init__(self, title: str, color, legend: bool) -> None:
        super().__init__()
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.color = color
        self.name = QLabel()
        # A long model name is cut, not allowed to widen its pane past the other's.
        self.name.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.set_title(title)
        self.rate = QLabel("")
        self.rate.setStyleSheet("font-size: 15px; font-weight: 600;")
        row.addWidget(self.name, 1)
        if legend:
            row.addWidget(QLabel(
                f"<span style='background:{DRAFT_BACKGROUND.name()}'>&nbsp;accepted from drafter&nbsp;</span>"
                "&nbsp;<span style='border:1px solid #ccc'>&nbsp;produced by target&nbsp;</span>"
            ))
        row.addWidget(self.rate)

    def set_title(self, title: str) -> None:
        self.name.setText(f"<b style='color:{self.color.name()}'>●</b> <b>{title}</b>")
        self.name.setToolTip(title)


class DemoView(QWidget):
    run_requested = Signal(str, object, str)  # prompt, DecodeSettings, drafter kind
    stop_requested = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)

        prompt_row = QHBoxLayout()
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Type a prompt, or pick an example →")
        self.prompt.setFixedHeight(64)
        self.examples = QComboBox()
        self.examples.addItem("Examples…", "")
        for label, text in example_prompts():
            self.examples.addItem(label, text)
        self.examples.setMaximumWidth(280)
        self.examples.activated.connect(self._use_example)
        buttons = QVBoxLayout()
        self.run_button = QPushButton("Run both")
        self.run_button.setDefault(True)
        self.run_button.setMinimumWidth(110)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.stop_button)
        prompt_row.addWidget(self.prompt, 1)
        prompt_row.addWidget(self.examples)
        prompt_row.addLayout(buttons)
        outer.addLayout(prompt_row)

        self.controls = DecodeControls()
        outer.addWidget(self.controls)

        note = QLabel(FAIRNESS_NOTE)
        note.setWordWrap(True)
        note.setStyleSheet("color: #555; font-size: 11px;")
        outer.addWidget(note)

        panes = QSplitter(Qt.Orientation.Horizontal)
        self.headers, self.panes = {}, {}
        for lane, title, color in (("plain", LANE_TITLES[0], PLAIN_COLOR), ("speculative", LANE_TITLES[1], SPEC_COLOR)):
            box = QWidget()
            col = QVBoxLayout(box)
            col.setContentsMargins(0, 0, 0, 0)
            self.headers[lane] = LaneHeader(title, color, legend=lane == "speculative")
            self.panes[lane] = StreamPane("The reply streams here.")
            col.addWidget(self.headers[lane])
            col.addWidget(self.panes[lane], 1)
            panes.addWidget(box)
            panes.setStretchFactor(panes.count() - 1, 1)
        panes.setSizes([1000, 1000])  # equal halves: neither run looks privileged

        stats = QHBoxLayout()
        self.values, self.captions = {}, {}
        for key, title in (("speedup", "Speedup"), ("identical", "Output"), ("ttft", "Time to first token"),
                           ("acceptance", "Acceptance rate"), ("per_pass", "Tokens per target pass")):
            box, self.captions[key], self.values[key] = _stat(title)
            stats.addWidget(box)
        charts = QHBoxLayout()
        self.speed_plot = SpeedPlot()
        self.acceptance_plot = AcceptancePlot()
        charts.addWidget(self.speed_plot, 3)
        charts.addWidget(self.acceptance_plot, 2)

        bottom = QWidget()
        bottom_layout = QVBoxLayout(bottom)
        bottom_layout.setContentsMargins(0, 0, 0, 0)
        bottom_layout.addLayout(stats)
        bottom_layout.addLayout(charts)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(panes)
        split.addWidget(bottom)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        outer.addWidget(split, 1)

        self.run_button.clicked.connect(self._request_run)
        self.stop_button.clicked.connect(self.stop_requested)
        # The charts redraw on a slow clock and the panes take text in batches, not on every
        # event: on a small machine every repaint (a pyqtgraph chart's axes and grid most) is CPU
        # time the engine's threads wait for; redrawing the chart at 10 Hz and the rest per event
        # cost the plain pane a third of its tokens/sec and overstated the speedup.
        self._timer = QTimer(self)
        self._timer.setInterval(CHART_REFRESH_MS)
        self._timer.timeout.connect(self._refresh_charts)
        self._timer.start()
        self._pending_rates: tuple | None = None
        self._flush_timer = QTimer(self)
        self._flush_timer.setSingleShot(True)
        self._flush_timer.setInterval(TEXT_FLUSH_MS)
        self._flush_timer.timeout.connect(self._flush)
        self._pending_text: dict[str, list] = {"plain": [], "speculative": []}
        self._pending_rate: dict[str, str] = {}
        self.last: dict[str, object] = {}
        self.result = None
        #: (draft model, drafter made for the target) where the loaded model can race the two.
        self.race_names: tuple[str, str] | None = None
        self.racing = False
        self.set_ready(False)

    # --- user actions -------------------------------------------------------------------------
    def _use_example(self, index: int) -> None:
        text = self.examples.itemData(index)
        if text:
            self.prompt.setPlainText(text)

    def _request_run(self) -> None:
        prompt = self.prompt.toPlainText().strip()
        if not prompt:
            self.prompt.setFocus()
            self.prompt.setPlaceholderText("Type a prompt first (or pick an example →)")
            return
        self.run_requested.emit(prompt, self.controls.settings(), self.controls.drafter_kind())

    # --- state --------------------------------------------------------------------------------
    def set_ready(self, ready: bool) -> None:
        self.run_button.setEnabled(ready)

    def set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        self.controls.setEnabled(not running)

    def start_run(self, race: bool = False) -> None:
        """Clear the panes for a run; ``race``: the two lanes are two drafters (named by
        ``race_names``), not plain decoding and speculation."""
        self.racing = race and self.race_names is not None
        titles = (f"Draft model: {self.race_names[0]}", self.race_names[1]) if self.racing else LANE_TITLES
        for lane, title in zip(("plain", "speculative"), titles):
            self.headers[lane].set_title(title)
        self.speed_plot.name_lanes(*(titles if self.racing else ("without speculation", "with speculation")))
        self.captions["speedup"].setText("Speedup over the draft model" if self.racing else "Speedup")
        self.values["speedup"].setToolTip(f"{titles[1]}'s tokens/sec over the draft model's." if self.racing
                                          else "Speculation's tokens/sec over plain decoding's, each on its own compute clock.")
        for lane in self.panes:
            self.panes[lane].clear()
            self.headers[lane].rate.setText("")
        for value in self.values.values():
            value.setText("–")
            value.setStyleSheet("font-size: 17px; font-weight: 600;")
        self.speed_plot.clear_runs()
        self._flush_timer.stop()
        self._pending_text = {"plain": [], "speculative": []}
        self._pending_rate, self._pending_rates = {}, None
        self.acceptance_plot.show_rates([])
        self.last, self.result = {}, None
        self.set_running(True)

    # --- engine events ------------------------------------------------------------------------
    def on_lane_event(self, item) -> None:
        """Record the event; the panes and figures take it on the next flush (at most every
        ``TEXT_FLUSH_MS``), so a fast lane's many small events cost one repaint, not many."""
        lane, event = item.lane, item.event
        if isinstance(event, Tokens):
            self._pending_text[lane].extend(item.segments)
        elif isinstance(event, (Stats, Finished)):
            stats = event.stats
            self.last[lane] = stats
            done = " · done" if isinstance(event, Finished) and event.reason != "cancelled" else (
                " · stopped" if isinstance(event, Finished) else "")
            reading = stats.new_tokens == 0 and 0 < stats.prompt_done < stats.prompt_tokens
            self._pending_rate[lane] = (describe(stats) if reading else
                                        f"{stats.tok_per_s:.1f} tok/s · {stats.new_tokens} token{'' if stats.new_tokens == 1 else 's'}{done}")
            if stats.seconds > 0:
                self.speed_plot.add(lane, stats.seconds, stats.tok_per_s)
        elif isinstance(event, Failed):
            self._flush()
            self.set_running(False)
            return
        if isinstance(event, Finished):
            self._flush()
        elif not self._flush_timer.isActive():  # a throttle, not a debounce: it fires while tokens flow
            self._flush_timer.start()

    def _flush(self) -> None:
        """Show what arrived since the last flush: text in the panes, rates, the figures."""
        self._flush_timer.stop()
        for lane, segments in self._pending_text.items():
            if segments:
                self.panes[lane].append_segments(segments)
                self._pending_text[lane] = []
        if self._pending_rate:
            for lane, text in self._pending_rate.items():
                self.headers[lane].rate.setText(text)
            self._pending_rate = {}
            self._update_stats()

    def _update_stats(self) -> None:
        plain, spec = self.last.get("plain"), self.last.get("speculative")
        if plain and spec and plain.tok_per_s > 0:
            self.values["speedup"].setText(f"{spec.tok_per_s / plain.tok_per_s:.2f}×")
        ttft = [f"{s.ttft_s * 1000:.0f} ms" if s and s.ttft_s is not None else "–" for s in (plain, spec)]
        self.values["ttft"].setText(f"{ttft[0]} / {ttft[1]}")
        if self.racing:  # both lanes draft: each one's figures, the draft model's first
            if plain and spec:
                self.values["acceptance"].setText(f"{plain.acceptance:.0%} / {spec.acceptance:.0%}")
                self.values["per_pass"].setText(f"{plain.tokens_per_pass:.2f} / {spec.tokens_per_pass:.2f}")
                self._pending_rates = (spec.acceptance_by_position, plain.acceptance_by_position)
        elif spec:
            if spec.drafted:
                self.values["acceptance"].setText(f"{spec.acceptance:.0%} of {spec.drafted}")
                self.values["per_pass"].setText(f"{spec.tokens_per_pass:.2f} ({spec.mean_accepted_per_pass:.2f} drafted)")
            self._pending_rates = (spec.acceptance_by_position, None)

    def _refresh_charts(self) -> None:
        self.speed_plot.refresh()
        if self._pending_rates is not None:
            self.acceptance_plot.show_rates(*self._pending_rates)
            self._pending_rates = None

    def on_result(self, result) -> None:
        self.result = result
        self._flush()
        self.set_running(False)
        self._refresh_charts()
        self.values["speedup"].setText(f"{result.speedup:.2f}×")
        identical = self.values["identical"]
        if "cancelled" in (result.plain.reason, result.speculative.reason):
            identical.setText("stopped")
            identical.setToolTip("The run was stopped before both replies finished.")
        elif result.identical:
            identical.setText("✔ identical")
            identical.setStyleSheet("font-size: 17px; font-weight: 600; color: #188038;")
            identical.setToolTip("Both drafters led to exactly the same tokens: the target decides every one." if self.racing
                                 else "Speculation produced exactly the tokens plain decoding produced.")
        elif result.divergence is not None:
            d = result.divergence
            identical.setText(f"≠ differs at token {d.position + 1}")
            identical.setStyleSheet("font-size: 17px; font-weight: 600; color: #b06000;")
            why = (f"The target's top-2 logit gap there is {d.top2_gap:.3f}: a near-tie, which rounding in a "
                   "multi-token check can flip. fp32 precision is token-identical.")
            identical.setToolTip(why)
            if result.divergence_chars:
                for lane, offset in zip(("plain", "speculative"), result.divergence_chars):
                    self.panes[lane].mark_from(offset, f"First differing token (#{d.position + 1}). {why}")
        else:
            identical.setText("differs (sampling)" if not result.identical else "✔ identical")
            identical.setToolTip("With sampling, both runs draw from the same distribution; texts need not match.")
