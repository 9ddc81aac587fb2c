"""Side by side, remote: two OpenAI-compatible endpoints raced on the same prompt.

Say a vLLM server with ``--speculative-config`` and one without, or two ``tandem serve``s with
speculation on and off. Each pane streams its endpoint's reply live, with tokens per second
from its own stream; the acceptance is what the server reports (per-request timings, else its
spec-decode counters around the request, else "not reported"); under greedy decoding the
lossless indicator compares the two outputs. The race runs on a thread of its own (HTTP only,
no model here), never on the GUI thread nor behind the local engine's jobs.
"""
from __future__ import annotations

import threading

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.demo.stream_pane import StreamPane

LANES = ("A", "B")


class _Text:
    from_draft = False

    def __init__(self, text: str) -> None:
        self.text = text


class EndpointLane(QGroupBox):
    def __init__(self, name: str) -> None:
        super().__init__(f"Endpoint {name}")
        grid = QGridLayout(self)
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://gpu-box:8000/v1")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("API key (if the server needs one)")
        self.model = QLineEdit()
        self.model.setPlaceholderText("model id (default: the server's first)")
        self.rate = QLabel("— tok/s")
        self.rate.setStyleSheet("font-weight: 600; font-size: 15px;")
        self.acceptance = QLabel("")
        self.acceptance.setWordWrap(True)
        self.pane = StreamPane("The reply streams here.")
        grid.addWidget(QLabel("URL"), 0, 0)
        grid.addWidget(self.url, 0, 1)
        grid.addWidget(QLabel("Key"), 1, 0)
        grid.addWidget(self.key, 1, 1)
        grid.addWidget(QLabel("Model"), 2, 0)
        grid.addWidget(self.model, 2, 1)
        grid.addWidget(self.rate, 3, 0, 1, 2)
        grid.addWidget(self.acceptance, 4, 0, 1, 2)
        grid.addWidget(self.pane, 5, 0, 1, 2)
        grid.setRowStretch(5, 1)

    def reset(self) -> None:
        self.pane.clear()
        self.rate.setText("— tok/s")
        self.acceptance.setText("")


class RemoteDemoView(QWidget):
    race_event = Signal(object)  # from the race thread; delivered on the GUI thread
    race_finished = Signal(object)  # engine.remote.race.RaceResult, for tests and screenshots

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.prompt = QPlainTextEdit("Write a Python function that reverses a linked list, with a docstring.")
        self.prompt.setMaximumHeight(70)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.max_tokens.setValue(128)
        self.run_button = QPushButton("Race")
        self.run_button.clicked.connect(self._toggle)
        top = QHBoxLayout()
        top.addWidget(self.prompt, 1)
        side = QVBoxLayout()
        side.addWidget(QLabel("Max tokens"))
        side.addWidget(self.max_tokens)
        side.addWidget(self.run_button)
        top.addLayout(side)
        self.lanes = [EndpointLane(name) for name in LANES]
        panes = QHBoxLayout()
        for lane in self.lanes:
            panes.addWidget(lane, 1)
        self.verdict = QLabel("Greedy decoding: lossless speculation gives both endpoints the same reply.")
        self.verdict.setWordWrap(True)
        self.error = QLabel("")
        self.error.setStyleSheet("color: #a50e0e;")
        self.error.setWordWrap(True)
        col = QVBoxLayout(self)
        col.addLayout(top)
        col.addLayout(panes, 1)
        col.addWidget(self.verdict)
        col.addWidget(self.error)
        self._cancel: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self.race_event.connect(self._on_event)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def set_endpoint(self, index: int, url: str, key: str = "", model: str = "") -> None:
        lane = self.lanes[index]
        lane.url.setText(url)
        lane.key.setText(key)
        lane.model.setText(model)

    def _toggle(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.run_button.setText("Stopping…")
            self.run_button.setEnabled(False)
            return
        self.start_race()

    def start_race(self) -> None:
        endpoints = [(lane.url.text().strip(), lane.key.text().strip(), lane.model.text().strip()) for lane in self.lanes]
        if not all(url for url, _, _ in endpoints):
            self.error.setText("Give both endpoints a URL.")
            return
        self.error.setText("")
        for lane in self.lanes:
            lane.reset()
        self.verdict.setText("Racing…")
        self.run_button.setText("Stop")
        self._cancel = threading.Event()
        prompt, max_tokens = self.prompt.toPlainText(), self.max_tokens.value()
        self._thread = threading.Thread(target=self._race, args=(endpoints, prompt, max_tokens, self._cancel),
                                        name="tandem-remote-race", daemon=True)
        self._thread.start()

    def _race(self, endpoints, prompt: str, max_tokens: int, cancel: threading.Event) -> None:
        from engine.remote.client import RemoteClient, RemoteEndpoint
        from engine.remote.race import Lane, race

        clients = [RemoteClient(RemoteEndpoint(url, key or None)) for url, key, _ in endpoints]
        try:
            lanes = []
            for (url, _, model), client in zip(endpoints, clients):
                lanes.append(Lane(url, client, model or client.list_models()[0].id))
            for event in race(lanes, [{"role": "user", "content": prompt}], cancel.is_set, max_tokens=max_tokens):
                self.race_event.emit(event)
        except Exception as exc:  # an endpoint that cannot be reached or lists no model
            self.race_event.emit(RuntimeError(str(exc)))
        finally:
            for client in clients:
                client.close()

    def _on_event(self, event) -> None:
        from engine.remote.race import LaneChunk, LaneDone, RaceResult

        if isinstance(event, LaneChunk):
            lane = self.lanes[event.lane]
            lane.pane.append_segments([_Text(event.chunk.text)])
            lane.rate.setText(f"{event.tok_per_s:.1f} tok/s")
        elif isinstance(event, LaneDone):
            lane, run = self.lanes[event.lane], event.run
            if run.error:
                lane.acceptance.setText(f"error: {run.error}")
            else:
                lane.rate.setText(f"{run.tok_per_s:.1f} tok/s ({run.new_tokens} tokens)")
                lane.acceptance.setText(run.acceptance.describe())
        elif isinstance(event, RaceResult):
            self._finish()
            if any(r.error for r in event.runs):
                self.verdict.setText("One endpoint did not finish: nothing to compare.")
            else:
                same = "✓ identical outputs (lossless)" if event.identical else "✗ the outputs differ"
                ratio = f"; A is {event.speedup:.2f}× B's speed" if event.speedup else ""
                self.verdict.setText(same + ratio)
            self.race_finished.emit(event)
        elif isinstance(event, Exception):
            self._finish()
            self.error.setText(str(event))
            self.verdict.setText("")

    def _finish(self) -> None:
        self._cancel = None
        self.run_button.setText("Race")
        self.run_button.setEnabled(True)

    def stop_and_wait(self, timeout: float = 10.0) -> None:
        if self._cancel is not None:
            self._cancel.set()
        if self._thread is not None:
            self._thread.join(timeout)
