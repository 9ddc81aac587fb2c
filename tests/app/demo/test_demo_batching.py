"""The demo view takes a burst of engine events as one repaint.

On a machine with few cores the GUI thread shares them with the engine's threads: every repaint
is time a decoding step waits for. A fast lane sends an event per token, so the panes, figures
and charts must take them in batches, yet show everything by the end of a run.
"""
from app.demo.demo_view import DemoView
from engine.core.events import Finished, RunStats, Stats, Tokens
from engine.decode.token_origin import Segment
from engine.session.side_by_side import LaneEvent


def _token(lane: str, text: str, drafted: bool = False) -> LaneEvent:
    return LaneEvent(lane, Tokens(text, (1,), (drafted,), 0, 0, 1.0), (Segment(text, drafted),))


def _stats(lane: str, n: int, finished: bool = False) -> LaneEvent:
    stats = RunStats(new_tokens=n, seconds=n / 10, tok_per_s=10.0, drafted=2 * n, accepted=n, acceptance=0.5,
                     acceptance_by_position=(0.75, 0.25) if n > 2 else (0.5,), tokens_per_pass=1.5)
    return LaneEvent(lane, Finished("max_new_tokens", stats) if finished else Stats(stats))


def _counting(obj, name: str) -> list:
    calls = []
    original = getattr(obj, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


def test_a_burst_of_tokens_is_one_append_and_all_text_arrives(qtbot):
    view = DemoView()
    qtbot.addWidget(view)
    view.start_run()
    appends = {lane: _counting(view.panes[lane], "append_segments") for lane in view.panes}
    pieces = [f"tok{i} " for i in range(40)]
    for i, piece in enumerate(pieces):
        view.on_lane_event(_token("plain", piece))
        view.on_lane_event(_stats("plain", i + 1))
        view.on_lane_event(_token("speculative", piece, drafted=i % 2 == 0))
    assert view.panes["plain"].toPlainText() == ""  # nothing painted inside the burst
    assert view._flush_timer.isActive()  # the clock that shows it is running; what it calls, called here
    view._flush()
    assert view.panes["plain"].toPlainText() == "".join(pieces)
    assert len(appends["plain"]) == 1 and len(appends["speculative"]) == 1
    assert view.panes["speculative"].toPlainText() == "".join(pieces)
    assert view.headers["plain"].rate.text() == "10.0 tok/s · 40 tokens"


def test_finished_shows_everything_at_once(qtbot):
    view = DemoView()
    qtbot.addWidget(view)
    view.start_run()
    for lane in ("plain", "speculative"):
        view.on_lane_event(_token(lane, "def f():"))
        view.on_lane_event(_stats(lane, 3, finished=True))
    # A finished lane is flushed at once, without waiting for the clock.
    assert view.panes["plain"].toPlainText() == "def f():" == view.panes["speculative"].toPlainText()
    assert view.headers["speculative"].rate.text().endswith("· done")
    assert view.values["acceptance"].text() == "50% of 6"


def test_charts_redraw_on_their_clock_not_per_event(qtbot):
    view = DemoView()
    qtbot.addWidget(view)
    view.start_run()
    bars = _counting(view.acceptance_plot.bars, "setOpts")
    curves = _counting(view.speed_plot.curves["speculative"], "setData")
    for n in range(1, 30):
        view.on_lane_event(_stats("speculative", n))
        view.on_lane_event(_stats("plain", n))
    view._flush()
    assert bars == [] and curves == []  # figures updated, charts not yet redrawn
    view._refresh_charts()
    assert len(bars) == 1 and len(curves) == 1
    assert list(view.acceptance_plot.bars.opts["height"]) == [0.75, 0.25]
    assert view.speed_plot.points["speculative"][0][-1] == 2.9
    view._refresh_charts()  # nothing new: no redraw
    assert len(bars) == 1 and len(curves) == 1


def test_same_rates_do_not_repaint_the_bars(qtbot):
    view = DemoView()
    qtbot.addWidget(view)
    bars = _counting(view.acceptance_plot.bars, "setOpts")
    view.acceptance_plot.show_rates((0.8, 0.6))
    view.acceptance_plot.show_rates([0.8, 0.6])
    assert len(bars) == 1
    view.acceptance_plot.show_rates((0.8, 0.5))
    assert len(bars) == 2
