"""Measures how long the GUI event loop goes without running: the user-visible freeze."""
from __future__ import annotations

import time

from PySide6.QtCore import QObject, QTimer


class StallMonitor(QObject):
    """A 10 ms timer; any gap beyond the interval is time the event loop was blocked."""

    def __init__(self, parent=None, interval_ms: int = 10) -> None:
        super().__init__(parent)
        self.interval = interval_ms / 1000
        self.worst_ms = 0.0
        self._last = time.perf_counter()
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)

    def start(self) -> None:
        self.reset()
        self._timer.start()

    def reset(self) -> None:
        self.worst_ms = 0.0
        self._last = time.perf_counter()

    def _tick(self) -> None:
        now = time.perf_counter()
        self.worst_ms = max(self.worst_ms, (now - self._last - self.interval) * 1000)
        self._last = now
