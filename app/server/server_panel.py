"""The Server tab: serve the loaded model over the OpenAI API from the app.

Host (loopback by default), port, API key (required off loopback), Start/Stop, the URL with a
Copy button, and the server's live counters (requests, drafted/accepted tokens) polled twice a
second from the handle (a lock and a few integers: nothing on the GUI thread waits on HTTP or
the model). Starting runs as a job on the app's engine thread (app/bridge/server_jobs.py); stopping
runs on a short-lived thread, so a request being cancelled never freezes the window.
"""
from __future__ import annotations

import ipaddress
import threading

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.bridge.server_jobs import ServerFailed, ServerStarted
from app.bridge.worker_state import stop_handle

DEFAULT_PORT = 8080  # llama-server's, as `tandem serve`
POLL_MS = 500


def looks_loopback(host: str) -> bool:
    """Without a DNS lookup (GUI thread): the server's own check resolves names when it starts."""
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def describe_counters(c) -> str:
    text = f"Requests: {c.requests_served} served, {c.in_flight} in flight"
    if c.requests_cancelled or c.requests_failed or c.requests_rejected:
        text += f" ({c.requests_cancelled} cancelled, {c.requests_failed} failed, {c.requests_rejected} refused)"
    if c.num_draft_tokens:
        rate = c.num_accepted_tokens / c.num_draft_tokens
        mean = 1 + c.num_accepted_tokens / max(1, c.num_drafts)
        text += (f"\nDrafted {c.num_draft_tokens} tokens, accepted {c.num_accepted_tokens} ({rate:.0%}); "
                 f"{mean:.2f} tokens per target pass")
    else:
        text += "\nNo drafts yet"
    return text


class ServerPanel(QWidget):
    start_requested = Signal(str, int, str)  # host, port, API key ("" for none)
    stopped = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.handle = None
        self.model_id = ""
        box = QGroupBox("Serve the loaded model over the OpenAI API")
        form = QFormLayout(box)
        self.host = QLineEdit("127.0.0.1")
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")
        self.port.setValue(DEFAULT_PORT)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("required unless the host is loopback")
        form.addRow("Host", self.host)
        form.addRow("Port", self.port)
        form.addRow("API key", self.key)
        self.toggle = QPushButton("Start")
        self.toggle.clicked.connect(self._toggle)
        self.url = QLabel("Not running")
        self.copy = QPushButton("Copy")
        self.copy.setEnabled(False)
        self.copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.url.text()))
        url_row = QHBoxLayout()
        url_row.addWidget(self.url, 1)
        url_row.addWidget(self.copy)
        form.addRow(self.toggle)
        form.addRow("URL", url_row)
        self.stats = QLabel("")
        self.error = QLabel("")
        self.error.setStyleSheet("color: #a50e0e;")
        self.error.setWordWrap(True)
        note = QLabel("Requests wait for the window's own replies, and the window's wait for them: "
                      "one model, one generation at a time. Loading another model stops the server.")
        note.setWordWrap(True)
        note.setStyleSheet("color: #5f6368;")
        col = QVBoxLayout(self)
        col.addWidget(box)
        col.addWidget(self.stats)
        col.addWidget(self.error)
        col.addWidget(note)
        col.addStretch(1)
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.refresh)
        self.stopped.connect(self._show_stopped)

    @property
    def running(self) -> bool:
        return self.handle is not None

    def _toggle(self) -> None:
        if self.handle is not None:
            self.stop()
            return
        host, key = self.host.text().strip() or "127.0.0.1", self.key.text().strip()
        if not looks_loopback(host) and not key:
            self.error.setText(f"Other machines can reach {host}: set an API key first.")
            return
        self.error.setText("")
        self.toggle.setEnabled(False)
        self.toggle.setText("Starting…")
        self.start_requested.emit(host, self.port.value(), key)

    def on_event(self, payload) -> None:
        """Payloads of the window's "serve" jobs."""
        if isinstance(payload, ServerStarted):
            self.handle, self.model_id = payload.handle, payload.model_id
            self.url.setText(f"{payload.url}/v1")
            self.copy.setEnabled(True)
            self.toggle.setText("Stop")
            self.toggle.setEnabled(True)
            self._set_inputs(False)
            self.refresh()
            self.timer.start()
        elif isinstance(payload, ServerFailed):
            self.error.setText(payload.message)
            self._show_stopped()
        elif type(payload).__name__ == "JobFailed":
            self.error.setText(payload.message)
            self._show_stopped()

    def refresh(self) -> None:
        handle = self.handle
        if handle is None:
            return
        if not handle.running:  # stopped from the engine side (a new model loads)
            self.handle = None
            self._show_stopped()
            return
        self.stats.setText(describe_counters(handle.counters()))

    def stop(self) -> None:
        handle, self.handle = self.handle, None
        self.timer.stop()
        if handle is None:
            return
        self.toggle.setEnabled(False)
        self.toggle.setText("Stopping…")
        threading.Thread(target=self._stop_then_signal, args=(handle,), name="tandem-server-stop", daemon=True).start()

    def stop_and_wait(self, timeout: float = 15.0) -> None:
        """For closing the window: stop on this thread (nothing else is left to keep responsive)."""
        handle, self.handle = self.handle, None
        self.timer.stop()
        if handle is not None:
            stop_handle(handle)

    def _stop_then_signal(self, handle) -> None:
        try:
            stop_handle(handle)
        finally:
            self.stopped.emit()

    def _show_stopped(self) -> None:
        self.timer.stop()
        self.url.setText("Not running")
        self.copy.setEnabled(False)
        self.toggle.setText("Start")
        self.toggle.setEnabled(True)
        self._set_inputs(True)

    def _set_inputs(self, enabled: bool) -> None:
        for widget in (self.host, self.port, self.key):
            widget.setEnabled(enabled)
