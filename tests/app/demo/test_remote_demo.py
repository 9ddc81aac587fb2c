"""The remote side-by-side races two real `tandem serve` endpoints on loopback (speculation on
and off): both panes stream, each with its own tok/s and the acceptance its server reports,
and the lossless indicator compares the outputs. Saves the screenshot the docs show."""
from __future__ import annotations

import os
from pathlib import Path

from tests.engine.remote.remote_servers import two_servers  # noqa: F401 (a fixture)

SHOT = Path(os.environ.get("TANDEM_SHOTS", "/tmp/work/shots")) / "remote_demo.png"


def test_race_two_endpoints(qtbot, make_window, two_servers):
    on, off = two_servers
    window = make_window(load=False)
    window.resize(1400, 900)
    view = window.remote_demo
    window.tabs.setCurrentWidget(view)
    view.set_endpoint(0, on.url + "/v1")
    view.set_endpoint(1, off.url, model="tiny-target")
    view.max_tokens.setValue(48)
    with qtbot.waitSignal(view.race_finished, timeout=120_000) as finished:
        view.run_button.click()
        assert view.run_button.text() == "Stop"
    result = finished.args[0]
    assert result.identical and all(r.new_tokens == 48 for r in result.runs)
    a, b = view.lanes
    assert a.pane.toPlainText() == result.runs[0].text and b.pane.toPlainText() == result.runs[1].text
    assert "tok/s (48 tokens)" in a.rate.text() and "tok/s (48 tokens)" in b.rate.text()
    assert "timings" in a.acceptance.text()  # tandem serve reports drafting per request
    assert "no drafts" in b.acceptance.text()  # the plain server drafted nothing
    assert "identical outputs" in view.verdict.text()
    assert view.run_button.text() == "Race"
    SHOT.parent.mkdir(parents=True, exist_ok=True)
    assert window.grab().save(str(SHOT))


def test_an_endpoint_that_is_down_is_reported(qtbot, make_window):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    window = make_window(load=False)
    view = window.remote_demo
    view.set_endpoint(0, f"http://127.0.0.1:{port}")
    view.set_endpoint(1, f"http://127.0.0.1:{port}")
    view.run_button.click()
    qtbot.waitUntil(lambda: bool(view.error.text()), timeout=30_000)
    assert "cannot be reached" in view.error.text() and view.run_button.text() == "Race"


def test_both_urls_are_needed(qtbot, make_window):
    window = make_window(load=False)
    view = window.remote_demo
    view.set_endpoint(0, "http://127.0.0.1:1")
    view.run_button.click()
    assert "both endpoints" in view.error.text() and not view.running
