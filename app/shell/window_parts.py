"""The main window's small parts: its UI states, the dismissible notice banner, and the status
strip (state, progress, cancel) at the bottom."""
from __future__ import annotations

from enum import Enum

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QStatusBar, QToolButton, QWidget

from app.bridge.messages import Progress
from engine.models.planning.memory_fit import human_bytes


class UiState(Enum):
    IDLE = "Idle"
    DOWNLOADING = "Downloading"
    LOADING = "Loading"
    GENERATING = "Generating"
    TRAINING = "Training a drafter"
    CANCELLING = "Cancelling"
    ERROR = "Error"


JOB_STATES = {"load": UiState.LOADING, "download": UiState.DOWNLOADING, "demo": UiState.GENERATING, "chat": UiState.GENERATING,
              "distill": UiState.TRAINING}
# Long jobs the status strip offers to cancel (the demo and the chat have their own Stop).
CANCELLABLE = (UiState.LOADING, UiState.DOWNLOADING, UiState.TRAINING)


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


class StatusStrip:
    """The status bar's state label, progress bar with its detail, and Cancel button."""

    def __init__(self, bar: QStatusBar) -> None:
        self.state_label = QLabel(UiState.IDLE.value)
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(260)
        self.progress.setTextVisible(True)
        self.detail = QLabel("")
        self.cancel_button = QPushButton("Cancel")
        bar.addWidget(self.state_label)
        bar.addWidget(self.detail, 1)
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.cancel_button)
        self.progress.hide()
        self.cancel_button.hide()

    def set_state(self, state: UiState) -> None:
        self.state_label.setText(state.value)
        self.cancel_button.setVisible(state in CANCELLABLE)
        self.cancel_button.setEnabled(state is not UiState.CANCELLING)
        if state in CANCELLABLE:
            self.show_progress(Progress("", 0, 0))  # the state label already names it

    def show_progress(self, p: Progress) -> None:
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
        self.detail.setText(text)

    def hide_progress(self) -> None:
        self.progress.hide()
        self.detail.setText("")
