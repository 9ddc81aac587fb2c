"""Live charts (pyqtgraph): tokens/sec of both runs over time, acceptance by draft position."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QColor

PLAIN_COLOR = QColor("#7f8c8d")
SPEC_COLOR = QColor("#1a73e8")

pg.setConfigOptions(antialias=True, background="w", foreground="#333")


class SpeedPlot(pg.PlotWidget):
    """tokens/sec (cumulative, on each run's own clock) against that run's elapsed seconds."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(150)
        self.setLabel("left", "tokens / s")
        self.getAxis("left").enableAutoSIPrefix(False)  # "0.6 tok/s", not "600 (x0.001)"
        self.setLabel("bottom", "seconds of compute")
        self.showGrid(x=True, y=True, alpha=0.2)
        self.legend = self.addLegend(offset=(8, 8))
        self.setMouseEnabled(x=False, y=False)
        self.curves = {
            "plain": self.plot([], [], pen=pg.mkPen(PLAIN_COLOR, width=2), name="without speculation"),
            "speculative": self.plot([], [], pen=pg.mkPen(SPEC_COLOR, width=2), name="with speculation"),
        }
        self.points: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in self.curves}
        self._dirty = False

    def name_lanes(self, plain: str, speculative: str) -> None:
        """The legend's names of the two runs (a race of two drafters names both)."""
        self.legend.clear()
        self.legend.addItem(self.curves["plain"], plain)
        self.legend.addItem(self.curves["speculative"], speculative)

    def clear_runs(self) -> None:
        for lane in self.curves:
            self.points[lane] = ([], [])
            self.curves[lane].setData([], [])

    def add(self, lane: str, seconds: float, tok_per_s: float) -> None:
        xs, ys = self.points[lane]
        xs.append(seconds)
        ys.append(tok_per_s)
        self._dirty = True

    def refresh(self) -> None:
        """Redraw at most once per timer tick, however fast tokens arrive."""
        if self._dirty:
            for lane, (xs, ys) in self.points.items():
                self.curves[lane].setData(xs, ys)
            self._dirty = False


class AcceptancePlot(pg.PlotWidget):
    """Fraction of drafted tokens accepted at each draft position 1..k; in a race of two
    drafters, the baseline lane's bars beside the other's."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(150)
        self.setLabel("left", "accepted")
        self.setLabel("bottom", "draft position")
        self.setYRange(0, 1.05)
        self.setMouseEnabled(x=False, y=False)
        self.showGrid(y=True, alpha=0.2)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=SPEC_COLOR)
        self.baseline_bars = pg.BarGraphItem(x=[], height=[], width=0.35, brush=PLAIN_COLOR)
        self.addItem(self.baseline_bars)
        self.addItem(self.bars)
        self._shown: tuple | None = None

    def show_rates(self, rates, baseline_rates=None) -> None:
        """``baseline_rates``: the raced drafter's, drawn left of each position's bar (None: one
        drafter, one bar a position)."""
        shown = (tuple(rates), None if baseline_rates is None else tuple(baseline_rates))
        if shown == self._shown:  # unchanged: no repaint (a step that drafted nothing, a race's other lane)
            return
        self._shown = shown
        if baseline_rates is None:
            self.baseline_bars.setOpts(x=[], height=[], width=0.35)
            xs = list(range(1, len(rates) + 1))
            self.bars.setOpts(x=xs, height=list(rates), width=0.7)
        else:
            self.baseline_bars.setOpts(x=[x + 1 - 0.18 for x in range(len(baseline_rates))], height=list(baseline_rates),
                                       width=0.35)
            self.bars.setOpts(x=[x + 1 + 0.18 for x in range(len(rates))], height=list(rates), width=0.35)
            rates = rates if len(rates) >= len(baseline_rates) else baseline_rates
        xs = list(range(1, len(rates) + 1))
        # Draft positions are whole numbers: one tick per bar, not pyqtgraph's 0.5 steps.
        self.getAxis("bottom").setTicks([[(x, str(x)) for x in xs]])
        if xs:
            self.setXRange(0.4, max(xs) + 0.6, padding=0)
