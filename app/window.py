"""Tandem's main window: Models, Side by side, Chat; one engine worker behind them."""
from __future__ import annotations

import logging
import time
from enum import Enum

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import gui_gc, jobs
from app.app_settings import AppSettings, Key
from app.chat_view import ChatView
from app.conversations import ConversationStore, describe_set_aside
from app.demo_view import DemoView
from app.messages import DrafterNote, JobEnded, JobEvent, JobFailed, MachineReport, ModelLoaded, Progress
from app.models_view import ModelsView, human_bytes
from app.presets import PresetStore, describe_skipped
from app.stall import StallMonitor
from app.worker import EngineHost
from engine.core.events import Failed
from engine.core.paths import data_dir
from engine.session.side_by_side import SideBySideResult

log = logging.getLogger(__name__)


class UiState(Enum):
    IDLE = "Idle"
    DOWNLOADING = "Downloading"
    LOADING = "Loading"
    GENERATING = "Generating"
    CANCELLING = "Cancelling"
    ERROR = "Error"


JOB_STATES = {"load": UiState.LOADING, "download": UiState.DOWNLOADING, "demo": UiState.GENERATING, "chat": UiState.GENERATING}


class ErrorBanner(QWidget):
    def __init__(self) -> None:
        super().__init__()
        self.setStyleSheet("background: #fce8e6; color: #a50e0e; border-radius: 4px;")
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 6, 6)
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.clicked.connect(self.hide)
        row.addWidget(self.text, 1)
        row.addWidget(close)
        self.hide()

    def show_error(self, message: str) -> None:
        self.text.setText(message)
        self.show()


class MainWindow(QMainWindow):
    demo_finished = Signal(object)  # SideBySideResult, for --screenshot --demo and tests
    model_loaded = Signal(object)
    #: Nothing could be loaded (no model installed, or the load failed): the message says why.
    no_model = Signal(str)

    def __init__(self, settings: AppSettings | None = None, autoload: bool = True) -> None:
        super().__init__()
        # Before the engine thread exists: cyclic garbage (Qt objects among it) is collected
        # on this thread only, never mid-load on the worker (see app/gui_gc.py).
        gui_gc.hold()
        self._holds_gc = True
        self.setWindowTitle("Tandem — fast local models with speculative decoding")
        self.settings = settings or AppSettings()
        self.state = UiState.IDLE
        self.active_job: int | None = None
        self.active_kind: str | None = None
        self.loaded: ModelLoaded | None = None
        self.last_report: MachineReport | None = None
        self.autoload = autoload
        self._progress_started = 0.0

        self.banner = ErrorBanner()
        self.model_label = QLabel("No model loaded")
        self.model_label.setStyleSheet("font-weight: 600;")
        # Which drafter is used when it is not the obvious one (MTP layers, prompt lookup instead).
        self.drafter_note = QLabel("")
        self.drafter_note.setStyleSheet("color: #7a5b00;")
        self.drafter_note.hide()
        self.tabs = QTabWidget()
        self.models = ModelsView()
        self.demo = DemoView()
        self.chat = ChatView(ConversationStore(data_dir() / "conversations"), PresetStore(data_dir() / "presets"), self.settings)
        self.tabs.addTab(self.models, "Models")
        self.tabs.addTab(self.demo, "Side by side")
        self.tabs.addTab(self.chat, "Chat")
        # Conversation files the store set aside at start: said once, dismissible, never modal.
        self.storage_notice = ErrorBanner()
        self.storage_notice.setStyleSheet("background: #fef7e0; color: #7a5b00; border-radius: 4px;")
        self.storage_notice.text.setTextFormat(Qt.TextFormat.PlainText)

        central = QWidget()
        col = QVBoxLayout(central)
        header = QHBoxLayout()
        title = QLabel("<span style='font-size:18px; font-weight:700'>Tandem</span>")
        header.addWidget(title)
        header.addSpacing(12)
        header.addWidget(self.model_label, 1)
        header.addWidget(self.drafter_note)
        col.addLayout(header)
        col.addWidget(self.banner)
        col.addWidget(self.storage_notice)
        notices = (describe_set_aside(self.chat.store.set_aside), describe_skipped(self.chat.presets.skipped))
        if notice := " ".join(n for n in notices if n):
            self.storage_notice.show_error(notice)
        col.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

        bar = self.statusBar()
        self.state_label = QLabel(UiState.IDLE.value)
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(260)
        self.progress.setTextVisible(True)
        self.progress_detail = QLabel("")
        self.cancel_button = QPushButton("Cancel")
        bar.addWidget(self.state_label)
        bar.addWidget(self.progress_detail, 1)
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.cancel_button)
        self.progress.hide()
        self.cancel_button.hide()

        self.stalls = StallMonitor(self)
        self.stalls.start()
        self.host = EngineHost(self)
        self.host.event.connect(self.on_event)
        self.cancel_button.clicked.connect(self.cancel)
        self.demo.run_requested.connect(self.run_demo)
        self.demo.stop_requested.connect(self.cancel)
        self.demo.controls.precision_changed.connect(self._precision_changed)
        self.chat.send_requested.connect(self.run_chat)
        self.chat.stop_requested.connect(self.cancel)
        self.models.load_requested.connect(self.load_entry)
        self.models.download_requested.connect(self.download_entry)
        self.models.context_changed.connect(self._context_changed)
        # Chat shortcuts work from any tab: they bring the chat forward.
        QShortcut(QKeySequence.StandardKey.New, self, lambda: self._to_chat(self.chat.new_chat))
        QShortcut(QKeySequence("Ctrl+K"), self, lambda: self._to_chat(self.chat.focus_search))

        self._restore()
        self.probe()

    # --- persistence --------------------------------------------------------------------------
    def _restore(self) -> None:
        s, c = self.settings, self.demo.controls
        geometry = s.get(Key.GEOMETRY)
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1280, 860)
        self.tabs.setCurrentIndex(s.get(Key.TAB, 1, int))
        self.demo.prompt.setPlainText(s.get(Key.DEMO_PROMPT, "") or "")
        self.chat.input.setPlainText(s.get(Key.CHAT_DRAFT, "") or "")
        c.drafter.setCurrentIndex(max(0, c.drafter.findData(s.get(Key.DRAFTER, "model"))))
        c.draft_length.setValue(s.get(Key.DRAFT_LENGTH, 0, int))
        c.mode.setCurrentIndex(max(0, c.mode.findData(s.get(Key.MODE, "greedy"))))
        c.temperature.setValue(s.get(Key.TEMPERATURE, 0.7, float))
        c.top_p.setValue(s.get(Key.TOP_P, 0.95, float))
        c.set_precision(s.get(Key.PRECISION, "fast"))
        c.max_new_tokens.setValue(s.get(Key.MAX_NEW_TOKENS, 128, int))
        self.models.set_context(s.get(Key.CONTEXT, 4096, int))

    def save_settings(self) -> None:
        s, c = self.settings, self.demo.controls
        s.set(Key.GEOMETRY, self.saveGeometry())
        s.set(Key.TAB, self.tabs.currentIndex())
        s.set(Key.DEMO_PROMPT, self.demo.prompt.toPlainText())
        s.set(Key.CHAT_DRAFT, self.chat.input.toPlainText())
        s.set(Key.DRAFTER, c.drafter_kind())
        s.set(Key.DRAFT_LENGTH, c.draft_length.value())
        s.set(Key.MODE, c.mode.currentData())
        s.set(Key.TEMPERATURE, c.temperature.value())
        s.set(Key.TOP_P, c.top_p.value())
        s.set(Key.PRECISION, c.precision.currentData())
        s.set(Key.MAX_NEW_TOKENS, c.max_new_tokens.value())
        s.set(Key.CONTEXT, self.models.context.currentData())
        self.chat.save_state()
        if self.loaded is not None:
            s.set(Key.MODEL_TARGET, self.loaded.target_path)
            s.set(Key.MODEL_DRAFTER, self.loaded.drafter_path)
        s.sync()

    # --- jobs ---------------------------------------------------------------------------------
    def _submit(self, kind: str, run) -> bool:
        if self.active_job is not None:
            self.banner.show_error("Tandem is busy: wait for the current task or cancel it first.")
            return False
        self.banner.hide()
        self.active_job = self.host.submit(kind, run)
        self.active_kind = kind
        self._set_state(JOB_STATES.get(kind, UiState.IDLE))
        return True

    def probe(self) -> None:
        # Probing runs beside other jobs' bookkeeping: it is quick and never blocks the UI state.
        self.host.submit("probe", jobs.probe_machine(self.models.context.currentData()))

    def load_default(self) -> None:
        self._submit("load", jobs.load_models(None, None, self.demo.controls.precision.currentData()))

    def _load_last_or_default(self, default_ready: bool) -> None:
        """Reopen what the user had loaded last time; otherwise the bundled offline pair."""
        from pathlib import Path

        target = self.settings.get(Key.MODEL_TARGET, "") or ""
        drafter = self.settings.get(Key.MODEL_DRAFTER, "") or ""
        precision = self.demo.controls.precision.currentData()
        if target and (Path(target) / "config.json").exists():
            drafter = drafter if drafter and (Path(drafter) / "config.json").exists() else None
            self._submit("load", jobs.load_models(target, drafter, precision))
        elif default_ready:
            self.load_default()
        else:
            self.tabs.setCurrentIndex(0)
            message = "No model is installed yet: pick one on the Models tab and press Download."
            self.banner.show_error(message)
            self.no_model.emit(message)

    def load_entry(self, fit) -> None:
        precision = self.demo.controls.precision.currentData()
        if fit is None or fit.entry.id == "default-offline":
            self.load_default()
            return
        from app.downloads import installed_paths  # the hub cache, resolved without network

        paths = installed_paths(fit.entry)
        if paths is None:
            self.banner.show_error(f"{fit.entry.name} is not downloaded yet: press Download first.")
            return
        self._submit("load", jobs.load_models(str(paths[0]), str(paths[1]) if paths[1] else None, precision))

    def download_entry(self, fit) -> None:
        from app.downloads import download_job

        self._submit("download", download_job(fit.entry))

    def run_demo(self, prompt: str, settings, drafter: str) -> None:
        if self._submit("demo", jobs.side_by_side(prompt, settings, drafter)):
            self.demo.start_run()
            self.stalls.reset()

    def run_chat(self, messages, settings, drafter: str) -> None:
        if not self._submit("chat", jobs.chat(messages, settings, drafter)):
            self.chat.job_ended()

    def _to_chat(self, action) -> None:
        self.tabs.setCurrentWidget(self.chat)
        action()

    def cancel(self) -> None:
        if self.active_job is not None:
            self._set_state(UiState.CANCELLING)
            self.host.cancel()

    def _precision_changed(self, precision: str) -> None:
        if self.loaded is None or self.loaded.precision == precision:
            return
        target, drafter = self.loaded.target_path, self.loaded.drafter_path or None
        self._submit("load", jobs.load_models(target, drafter, precision))

    def _context_changed(self, context: int) -> None:
        self.probe()

    # --- events from the worker ---------------------------------------------------------------
    def on_event(self, envelope: JobEvent) -> None:
        payload, kind = envelope.payload, envelope.kind
        if isinstance(payload, Progress):
            self._show_progress(payload)
        elif isinstance(payload, MachineReport):
            self.last_report = payload
            self.models.show_report(payload)
            if self.autoload and self.loaded is None and self.active_job is None:
                self.autoload = False
                self._load_last_or_default(payload.default_pair_ready)
        elif isinstance(payload, ModelLoaded):
            self._loaded(payload)
        elif isinstance(payload, DrafterNote):
            self.drafter_note.setText(payload.text)
            self.drafter_note.show()
        elif isinstance(payload, JobFailed):
            self._fail(payload.message)
            if kind == "load" and self.loaded is None:
                self.no_model.emit(payload.message)
        elif isinstance(payload, JobEnded):
            if envelope.job == self.active_job:
                self.active_job = self.active_kind = None
                self._hide_progress()
                if self.state is not UiState.ERROR:
                    self._set_state(UiState.IDLE)
                self.demo.set_running(False)
                self.demo.set_ready(self.loaded is not None)
                self.chat.job_ended()
                if kind == "download":
                    self.probe()
        elif kind == "demo":
            self._demo_event(payload)
        elif kind == "chat":
            if isinstance(payload.event, Failed):
                self._fail(payload.event.error)
            self.chat.on_lane_event(payload)
        elif kind == "download":
            self._download_event(payload)

    def _demo_event(self, payload) -> None:
        if isinstance(payload, SideBySideResult):
            self.demo.on_result(payload)
            log.info("demo: speedup %.2fx, identical %s, worst UI stall %.0f ms", payload.speedup, payload.identical, self.stalls.worst_ms)
            self.demo_finished.emit(payload)
            return
        if isinstance(payload.event, Failed):
            self._fail(payload.event.error)
        self.demo.on_lane_event(payload)

    def _download_event(self, payload) -> None:
        from app.downloads import describe_download_event

        progress, error = describe_download_event(payload)
        if progress is not None:
            self._show_progress(progress)
        if error:
            self._fail(error)

    def _loaded(self, loaded: ModelLoaded) -> None:
        self.loaded = loaded
        gui_gc.settle()  # later collections on this thread skip the models' objects
        if loaded.drafter:
            drafter = f" + {loaded.drafter} drafting"
        else:
            drafter = " (drafting with its MTP layers)" if loaded.drafter_kind == "mtp" else " (prompt-lookup drafting)"
        mode = {"fast": "fast, bf16", "exact": "exact, fp32", "int8": "quantized, int8", "int4": "quantized, int4"}.get(loaded.precision, loaded.precision)
        self.model_label.setText(f"{loaded.target}{drafter} · {mode} · {loaded.device}")
        self.statusBar().showMessage(f"Loaded in {loaded.seconds:.1f} s", 8000)
        self.demo.controls.set_precision(loaded.precision)
        self.demo.controls.offer_drafter(loaded.drafter_kind)
        self.drafter_note.setVisible(bool(loaded.note))
        self.drafter_note.setText(loaded.note or "")
        self.demo.set_ready(True)
        self.chat.set_model(loaded)
        self.model_loaded.emit(loaded)

    def _fail(self, message: str) -> None:
        self.banner.show_error(message)
        self._set_state(UiState.ERROR)

    def _set_state(self, state: UiState) -> None:
        self.state = state
        self.state_label.setText(state.value)
        busy = state in (UiState.LOADING, UiState.DOWNLOADING, UiState.GENERATING, UiState.CANCELLING)
        self.cancel_button.setVisible(state in (UiState.LOADING, UiState.DOWNLOADING))
        self.cancel_button.setEnabled(state is not UiState.CANCELLING)
        self.models.set_busy(busy)
        if state in (UiState.LOADING, UiState.DOWNLOADING):
            self._show_progress(Progress("", 0, 0))  # the state label already names it

    def _show_progress(self, p: Progress) -> None:
        if not self.progress.isVisible():
            self._progress_started = time.monotonic()
        self.progress.show()
        if p.total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * p.done / p.total))
        else:
            self.progress.setRange(0, 0)  # busy indicator: no honest percentage exists
        text = p.stage or ""
        if p.unit == "bytes" and p.total:
            text += f" · {human_bytes(p.done)} of {human_bytes(p.total)}"
        if p.detail:
            text += f" · {p.detail}" if text else p.detail
        self.progress_detail.setText(text)

    def _hide_progress(self) -> None:
        self.progress.hide()
        self.progress_detail.setText("")

    # --- closing ------------------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        self.save_settings()
        self.host.cancel()
        self.host.shutdown()
        if self._holds_gc:
            self._holds_gc = False
            gui_gc.release()
        super().closeEvent(event)
