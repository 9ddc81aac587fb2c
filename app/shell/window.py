"""Tandem's main window: Models, Side by side, Chat; one engine worker behind them."""
from __future__ import annotations

import logging
from dataclasses import replace

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMainWindow, QTabWidget, QVBoxLayout, QWidget

from app.bridge import jobs
from app.bridge.messages import DrafterNote, DrafterTrained, JobEnded, JobEvent, JobFailed, KernelReport
from app.bridge.messages import MachineReport, ModelLoaded, Progress
from app.bridge.remote_jobs import use_remote
from app.bridge.server_jobs import start_server
from app.bridge.worker import EngineHost
from app.chat.chat_view import ChatView
from app.demo.demo_view import DemoView
from app.demo.remote_demo import RemoteDemoView
from app.picker import add_model
from app.picker.local_models import ImportFailed, LocalModels, load_local
from app.picker.model_settings import DEFAULT_PAIR, ModelSettingsStore
from app.picker.models_view import ModelsView
from app.picker.remote_models import RemoteModelsBox
from app.server.server_panel import ServerPanel
from app.shell import gui_gc, train_drafter, window_startup, window_state
from app.shell.speculation_status import SpeculationStatus
from app.shell.stall import StallMonitor
from app.shell.window_parts import JOB_STATES, ErrorBanner, StatusStrip, UiState
from app.shell.window_precision import offer_precisions, reload_job
from app.store.app_settings import AppSettings
from app.store.conversations import ConversationStore, describe_set_aside
from app.store.presets import PresetStore, describe_skipped
from engine.core.events import Failed
from engine.core.paths import data_dir
from engine.session.side_by_side import SideBySideResult

log = logging.getLogger(__name__)


class MainWindow(QMainWindow):
    demo_finished = Signal(object)  # SideBySideResult, for --screenshot --demo and tests
    model_loaded = Signal(object)
    #: Nothing could be loaded (no model installed, or the load failed): the message says why.
    no_model = Signal(str)

    def __init__(self, settings: AppSettings | None = None, autoload: bool = True) -> None:
        super().__init__()
        # Before the engine thread exists: cyclic garbage (Qt objects among it) is collected
        # on this thread only, never mid-load on the worker (see app/shell/gui_gc.py).
        gui_gc.hold()
        self._holds_gc = True
        self.setWindowTitle("Tandem — fast local models with speculative decoding")
        self.settings = settings or AppSettings()
        self.state = UiState.IDLE
        self.active_job: int | None = None
        self.active_kind: str | None = None
        self.loaded: ModelLoaded | None = None
        #: A precision asked for on the command line: it wins over the default pair's own default.
        self.precision_override: str | None = None
        self.last_report: MachineReport | None = None
        self.autoload = autoload

        self.banner = ErrorBanner()
        self.model_label = QLabel("No model loaded")
        self.model_label.setStyleSheet("font-weight: 600;")
        # Which drafter is used when it is not the obvious one (MTP layers, prompt lookup instead).
        self.drafter_note = QLabel("")
        self.drafter_note.setStyleSheet("color: #7a5b00;")
        self.drafter_note.hide()
        self.tabs = QTabWidget()
        self.model_store = ModelSettingsStore(self.settings)
        self.models = ModelsView(self.model_store)
        self.about = None  # app.shell.about.AboutDialog, made on first use
        self.demo = DemoView()
        self.chat = ChatView(ConversationStore(data_dir() / "conversations"), PresetStore(data_dir() / "presets"), self.settings)
        self.tabs.addTab(self.models, "Models")
        self.tabs.addTab(self.demo, "Side by side")
        self.tabs.addTab(self.chat, "Chat")
        self.remote_models = RemoteModelsBox()  # remote servers' models, under the local catalog
        self.models.layout().addWidget(self.remote_models)
        self.remote_demo = RemoteDemoView()  # two remote endpoints raced: HTTP only, no local engine
        self.tabs.addTab(self.remote_demo, "Side by side: remote")
        self.server_panel = ServerPanel()
        self.tabs.addTab(self.server_panel, "Server")
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
        # Why speculation is not what runs, on the tabs that decode.
        self.speculation = SpeculationStatus()
        col.addWidget(self.speculation)
        col.addWidget(self.tabs, 1)
        self.setCentralWidget(central)
        self.add_model_action = add_model.install(self)  # File > Add model file…, and the picker's button
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction("&About Tandem", self.show_about)
        self.last_trained: DrafterTrained | None = None
        self.train_drafter_action = train_drafter.install(self)  # Model > Train a drafter…, and its notice

        self.status = StatusStrip(self.statusBar())
        # The strip's widgets, by the names the window has always had (tests and the self-test read them).
        self.state_label, self.progress = self.status.state_label, self.status.progress
        self.progress_detail, self.cancel_button = self.status.detail, self.status.cancel_button

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
        self.remote_models.use_requested.connect(
            lambda url, key, model: self._submit("load", use_remote(url, key or None, model)))
        # Starting the server queues behind the window's running job (the Session is the worker's).
        self.server_panel.start_requested.connect(
            lambda host, port, key: self.host.submit("serve", start_server(host, port, key)))
        self.models.load_requested.connect(self.load_entry)
        self.models.download_requested.connect(self.download_entry)
        self.models.context_changed.connect(self._context_changed)
        self.demo.controls.drafter.currentIndexChanged.connect(
            lambda _: self.speculation.update_state(choice=self.demo.controls.drafter_kind(), off_steps=0))
        self.demo.controls.precision.currentIndexChanged.connect(lambda _: self._app_precision_changed())
        self.tabs.currentChanged.connect(self._tab_changed)
        # Chat shortcuts work from any tab: they bring the chat forward.
        QShortcut(QKeySequence.StandardKey.New, self, lambda: self._to_chat(self.chat.new_chat))
        QShortcut(QKeySequence("Ctrl+K"), self, lambda: self._to_chat(self.chat.focus_search))

        self._restore()
        self.list_after_probe: int | None = None  # the first probe's job, when the scan waits for it
        window_startup.begin(self)

    def _restore(self) -> None:
        window_state.restore(self)

    def save_settings(self) -> None:
        window_state.save(self)

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

    def probe(self, list_models: bool = True) -> int:
        """Probe the machine (and list the local models); returns the probe's job id."""
        # Probing runs beside other jobs' bookkeeping: it is quick and never blocks the UI state.
        job = self.host.submit("probe", jobs.probe_machine(self.models.context.currentData()))
        if list_models:
            add_model.list_local_models(self)  # LM Studio's, Ollama's, llama.cpp's and imported GGUF files
        return job

    def _model_settings(self, entry_id: str):
        """The model's own settings, its precision resolved (what the picker shows it at)."""
        return replace(self.model_store.get(entry_id), precision=self.models.load_precision(entry_id))

    def load_default(self) -> None:
        settings = self._model_settings(DEFAULT_PAIR)
        if self.precision_override:  # `python -m app --precision X`: the first load of the pair too
            settings = replace(settings, precision=self.precision_override)
            self.precision_override = None
        self._submit("load", jobs.load_models(None, None, settings.precision, settings=settings))

    def load_entry(self, fit) -> None:
        if fit is None or fit.entry.id == "default-offline":
            self.load_default()
            return
        local = self.models.local.get(fit.entry.id)
        if local is not None:  # a GGUF file on this disk: it runs as it is, precision "file"
            self._submit("load", load_local(local, self.model_store.get(fit.entry.id)))
            return
        from app.picker.downloads import installed_paths  # the hub cache, resolved without network

        paths = installed_paths(fit.entry, fit.gguf)
        if paths is None:
            self.banner.show_error(f"{fit.entry.name} ({fit.variant}) is not downloaded yet: press Download first.")
            return
        settings = self._model_settings(fit.entry.id)
        self._submit("load", jobs.load_models(str(paths[0]), str(paths[1]) if paths[1] else None, settings.precision,
                                              settings=settings))

    def download_entry(self, fit) -> None:
        from app.picker.downloads import download_job

        # A GGUF row fetches its variant's file and its drafter's, a safetensors row the repos.
        self._submit("download", download_job(fit.entry, fit.gguf.quant if fit.gguf is not None else None))

    def run_demo(self, prompt: str, settings, drafter: str) -> None:
        if self._submit("demo", jobs.side_by_side(prompt, settings, drafter)):
            self.demo.start_run(race=drafter == "race")
            self.stalls.reset()

    def run_chat(self, messages, settings, drafter: str) -> None:
        if not self._submit("chat", jobs.chat(messages, settings, drafter, self.chat.tools)):
            self.chat.job_ended()

    def _to_chat(self, action) -> None:
        self.tabs.setCurrentWidget(self.chat)
        action()

    def cancel(self) -> None:
        if self.active_job is not None:
            self._set_state(UiState.CANCELLING)
            self.host.cancel()

    def _app_precision_changed(self) -> None:
        """Other models follow the demo's precision; "file" is one file's own quantization, so
        only the loaded GGUF model can follow that choice."""
        precision = self.demo.controls.precision.currentData()
        if precision and precision != "file":
            self.models.set_app_precision(precision)

    def _precision_changed(self, precision: str) -> None:
        if self.loaded is not None and self.loaded.precision != precision:
            self._submit("load", reload_job(self.loaded, precision, self._model_settings(DEFAULT_PAIR)))

    def _context_changed(self, context: int) -> None:
        self.probe()

    def _tab_changed(self, index: int) -> None:
        self.speculation.set_on_tab(self.tabs.widget(index) in (self.demo, self.chat))

    def show_about(self):
        from app.shell.about import AboutDialog
        from engine.core.paths import log_dir

        if self.about is None:
            self.about = AboutDialog(log_dir(), self)
            self.host.submit("kernels", jobs.kernel_report())  # kernels imports torch: the worker asks
        self.about.show()
        self.about.raise_()
        return self.about

    def _lane_finished(self, payload) -> None:
        """A speculative reply's end: did the draft-length controller switch speculation off?"""
        from engine.core.events import Finished

        event = getattr(payload, "event", None)
        if isinstance(event, Finished) and getattr(payload, "lane", "") in ("speculative", "chat"):
            st = event.stats
            self.speculation.update_state(off_steps=st.speculation_off_steps,
                                          steps=st.target_passes, acceptance=st.acceptance,
                                          threads_fewest=st.threads_fewest, threads_max=st.threads_max)

    # --- events from the worker ---------------------------------------------------------------
    def on_event(self, envelope: JobEvent) -> None:
        payload, kind = envelope.payload, envelope.kind
        if kind == "serve":
            self.server_panel.on_event(payload)
        elif isinstance(payload, Progress):
            self.status.show_progress(payload)
        elif isinstance(payload, LocalModels):
            self.models.show_local(payload.fits, payload.added)
        elif isinstance(payload, ImportFailed):
            self._fail(payload.message)
        elif isinstance(payload, MachineReport):
            self.last_report = payload
            self.models.show_report(payload)
            if not payload.installed and not payload.default_pair_ready and payload.offline:
                self.models.show_offline(f"No model is installed yet and there is no network ({payload.offline}). "
                                         "Connect (or unset HF_HUB_OFFLINE) to download one.")
            if self.autoload and self.loaded is None and self.active_job is None:
                self.autoload = False
                window_startup.load_last_or_default(self, payload.default_pair_ready)
        elif isinstance(payload, ModelLoaded):
            self._loaded(payload)
        elif isinstance(payload, DrafterTrained):
            train_drafter.on_trained(self, payload)
        elif isinstance(payload, DrafterNote):
            self.drafter_note.setText(payload.text)
            self.drafter_note.show()
            self.speculation.update_state(engine_note=payload.text)
        elif isinstance(payload, KernelReport):
            if self.about is not None:
                self.about.show_kernels(payload.text)
        elif isinstance(payload, JobFailed):
            self._fail(payload.message)
            if kind == "load" and self.loaded is None:
                self.no_model.emit(payload.message)
        elif isinstance(payload, JobEnded):
            window_startup.job_ended(self, envelope.job)  # behind the first load, if one was asked for
            if envelope.job == self.active_job:
                self.active_job = self.active_kind = None
                self.status.hide_progress()
                if self.state is not UiState.ERROR:
                    self._set_state(UiState.IDLE)
                self.demo.set_running(False)
                self.demo.set_ready(self.loaded is not None)
                self.chat.job_ended()
                if kind == "download":
                    self.probe()
        elif kind == "demo":
            self._lane_finished(payload)
            self._demo_event(payload)
        elif kind == "chat":
            if not hasattr(payload, "event"):  # a tool call's, not a reply's (app/chat/chat_tools.py)
                self.chat.on_tool_event(payload)
                return
            self._lane_finished(payload)
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
        from app.picker.downloads import describe_download_event

        progress, error = describe_download_event(payload)
        if progress is not None:
            self.status.show_progress(progress)
        if error:
            self._fail(error)

    def _loaded(self, loaded: ModelLoaded) -> None:
        self.loaded = loaded
        gui_gc.settle()  # later collections on this thread skip the models' objects
        if loaded.precision == "remote":
            drafter = " (on the server)"
        elif loaded.drafter:
            drafter = f" + {loaded.drafter} drafting"
        else:
            drafter = " (drafting with its MTP layers)" if loaded.drafter_kind == "mtp" else " (prompt-lookup drafting)"
        if loaded.precision == "remote":
            mode = loaded.precision
        else:
            offer_precisions(self.demo.controls.precision, loaded)
            mode = self.demo.controls.precision.currentText() or loaded.precision
        self.model_label.setText(f"{loaded.target}{drafter} · {mode} · {loaded.device}")
        self.statusBar().showMessage(f"Loaded in {loaded.seconds:.1f} s" + (f". {loaded.resident}" if loaded.resident else ""),
                                     8000 if not loaded.resident else 20000)
        self.demo.race_names = (loaded.race_against, loaded.drafter) if loaded.race_against else None
        self.demo.controls.offer_drafter(loaded.drafter_kind, race=loaded.race_against is not None)
        if loaded.settings is not None:  # the model's own drafter and draft length
            c = self.demo.controls
            wanted = loaded.settings.drafter if loaded.settings.drafter not in ("model", "trained") else loaded.drafter_kind
            c.drafter.setCurrentIndex(max(0, c.drafter.findData(wanted)))
            c.draft_length.setValue(loaded.settings.draft_length)
        if loaded.race_against:  # a drafter made for the target, with the draft model beside it: race them
            self.demo.controls.drafter.setCurrentIndex(self.demo.controls.drafter.findData("race"))
        self.speculation.update_state(choice=self.demo.controls.drafter_kind(), target=loaded.target, drafter=loaded.drafter,
                                      loaded_kind=loaded.drafter_kind, refused=loaded.drafter_refused, engine_note=None,
                                      off_steps=0)
        self.drafter_note.setVisible(bool(loaded.note))
        self.drafter_note.setText(loaded.note or "")
        self.demo.set_ready(loaded.precision != "remote")  # the local race needs a local model
        self.chat.set_model(loaded)
        self.model_loaded.emit(loaded)

    def _fail(self, message: str) -> None:
        self.banner.show_error(message)
        self._set_state(UiState.ERROR)

    def _set_state(self, state: UiState) -> None:
        self.state = state
        self.status.set_state(state)
        self.models.set_busy(state in (UiState.LOADING, UiState.DOWNLOADING, UiState.GENERATING, UiState.TRAINING, UiState.CANCELLING))

    # --- closing ------------------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        self.save_settings()
        self.server_panel.stop_and_wait()
        self.remote_demo.stop_and_wait()
        self.host.cancel()
        self.host.shutdown()
        if self._holds_gc:
            self._holds_gc = False
            gui_gc.release()
        super().closeEvent(event)
