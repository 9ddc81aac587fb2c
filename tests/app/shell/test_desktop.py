"""Desktop conventions on a real window offscreen: the first-run tour, remembered size, tab and
splitters, the system's dark scheme, Help > About, the crash dialog."""
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QSplitter

from tests.app.conftest import wait_idle


def test_first_run_offline_with_an_empty_cache_says_so_at_once(qtbot, app_settings, monkeypatch):
    import time

    from app.shell.window import MainWindow

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("engine.models.loading.default_pair.installed_paths", lambda: None)  # the bundled pair not set up
    start = time.monotonic()
    window = MainWindow(app_settings)  # a first run: no settings, autoload on
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.no_model, timeout=30_000) as said:
        pass
    assert time.monotonic() - start < 15  # no long network wait
    assert "no network" in said.args[0] and "HF_HUB_OFFLINE" in said.args[0]
    assert window.tabs.currentWidget() is window.models
    assert window.models.offline_notice.isVisible() and "HF_HUB_OFFLINE" in window.models.offline_notice.text()
    fit = window.models.selected()
    assert fit is not None and fit.recommended  # opens on the recommended model
    # One primary button: it is not installed, so Download (and no Load beside it).
    assert window.models.download_button.isVisible() and window.models.download_button.isDefault()
    assert not window.models.load_button.isVisible()
    wait_idle(qtbot, window)
    window.close()


def test_size_tab_and_splitters_are_remembered(qtbot, app_settings, tmp_path):
    from PySide6.QtCore import QSettings

    from app.shell.window import MainWindow
    from app.store.app_settings import AppSettings

    window = MainWindow(app_settings, autoload=False)
    qtbot.addWidget(window)
    window.show()
    window.resize(1210, 707)
    qtbot.wait(50)
    window.tabs.setCurrentWidget(window.demo)
    qtbot.wait(50)
    splitters = window.findChildren(QSplitter)
    index, first = next((i, sp) for i, sp in enumerate(splitters) if sp.isVisible() and sum(sp.sizes()) > 100)
    total = sum(first.sizes())
    first.setSizes([total // 5, total - total // 5])
    wanted = first.sizes()
    qtbot.wait(50)
    window.close()

    again = MainWindow(app_settings, autoload=False)
    qtbot.addWidget(again)
    again.show()
    qtbot.wait(50)
    # restoreGeometry keeps a window on its screen: the offscreen one is 800 px wide, narrower
    # than the window's minimum width, so the height (which fits) is what can be compared.
    assert again.height() == 707 and again.height() != 860
    assert again.tabs.currentWidget() is again.demo
    # The divider is where it was left; the last pane takes what the (screen-clamped) size leaves.
    restored = again.findChildren(QSplitter)[index]
    assert restored.sizes()[0] == wanted[0]
    fresh = MainWindow(AppSettings(QSettings(str(tmp_path / "fresh.ini"), QSettings.Format.IniFormat)), autoload=False)
    qtbot.addWidget(fresh)
    fresh.show()
    fresh.tabs.setCurrentWidget(fresh.demo)
    qtbot.wait(50)
    assert fresh.findChildren(QSplitter)[index].sizes()[0] != wanted[0]  # not where a new window puts it
    fresh.close()
    again.close()


def test_dark_scheme_applies_a_dark_palette(qapp):
    from PySide6.QtGui import QPalette

    from app.shell.theme import apply_theme, dark_palette

    before = qapp.palette()
    try:
        assert apply_theme(qapp, Qt.ColorScheme.Dark)
        window_color = qapp.palette().color(QPalette.ColorRole.Window)
        assert window_color.lightness() < 60 and window_color == dark_palette().color(QPalette.ColorRole.Window)
        assert qapp.palette().color(QPalette.ColorRole.Text).lightness() > 180
        assert not apply_theme(qapp, Qt.ColorScheme.Light)
        assert qapp.palette().color(QPalette.ColorRole.Window).lightness() > 150
    finally:
        qapp.setPalette(before)


def test_following_the_system_switches_when_the_scheme_does(qapp):
    from PySide6.QtGui import QPalette

    from app.shell.theme import follow_system

    hints = qapp.styleHints()
    if not hasattr(hints, "setColorScheme"):  # Qt < 6.8: the palette function's test covers it
        return
    before, scheme = qapp.palette(), hints.colorScheme()
    try:
        follow_system(qapp)
        hints.setColorScheme(Qt.ColorScheme.Dark)
        QApplication.processEvents()
        if hints.colorScheme() == Qt.ColorScheme.Dark:  # the offscreen platform may not take it
            assert qapp.palette().color(QPalette.ColorRole.Window).lightness() < 60
    finally:
        hints.setColorScheme(scheme)
        qapp.setPalette(before)


def test_about_shows_version_kernels_and_log_folder(qtbot, app_settings):
    from app.shell.about import app_version
    from app.shell.window import MainWindow
    from engine.core.paths import log_dir

    window = MainWindow(app_settings, autoload=False)
    qtbot.addWidget(window)
    window.show()
    actions = [a.text() for m in window.menuBar().actions() for a in m.menu().actions()]
    assert "&About Tandem" in actions
    about = window.show_about()
    assert about.isVisible() and app_version() in about.title.text() and app_version() != "unknown"
    qtbot.waitUntil(lambda: "linear" in about.kernels.text(), timeout=120_000)  # from the worker
    assert str(log_dir()) in about.logs.text() and about.open_logs.isEnabled()
    wait_idle(qtbot, window)
    window.close()


def test_a_crash_shows_the_log_path(qapp, tmp_path):
    from app.shell.crash_dialog import show_crash

    box = show_crash("ValueError: boom", tmp_path / "crash.log")
    try:
        assert box.isVisible() and not box.isModal()
        assert str(tmp_path / "crash.log") in box.text() and "ValueError: boom" in box.text()
    finally:
        box.close()


def test_the_uncaught_error_hook_shows_the_dialog(qapp, monkeypatch):
    import sys

    import app.__main__ as entry
    from app.shell import crash_dialog

    shown = []
    monkeypatch.setattr(crash_dialog, "show_crash", lambda error, path: shown.append((error, path)))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # restored after the test
    import faulthandler

    log_path = entry.setup_logging()
    try:
        try:
            raise RuntimeError("unexpected")
        except RuntimeError:
            sys.excepthook(*sys.exc_info())
    finally:
        faulthandler.enable(sys.__stderr__)  # setup_logging pointed it at crash.log
    assert shown and shown[0][0] == "RuntimeError: unexpected"
    assert shown[0][1] == log_path.parent / "crash.log" and "unexpected" in shown[0][1].read_text()


def test_the_hub_probe_answers_within_its_bound(monkeypatch):
    import time

    from app.bridge.jobs import hub_unreachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" in hub_unreachable()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("app.bridge.jobs.HUB_HOST", ("127.0.0.1", 9))  # the discard port: nothing listens
    start = time.monotonic()
    why = hub_unreachable(0.5)
    assert why and time.monotonic() - start < 1.5
