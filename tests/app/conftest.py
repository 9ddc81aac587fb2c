"""App tests drive a real window (Qt offscreen) against real engine runs on tiny models."""
import pytest
from PySide6.QtCore import QSettings

from app.bridge.worker import EngineHost
from app.store.app_settings import AppSettings


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    from engine.testing.tiny_models import save_pair

    return save_pair(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture()
def app_settings(tmp_path):
    return AppSettings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))


@pytest.fixture(autouse=True)
def no_engine_thread_left(qapp):
    """Fail any test that leaves an engine QThread running (after its windows are closed)."""
    yield
    from PySide6.QtWidgets import QApplication

    for widget in QApplication.topLevelWidgets():
        widget.close()
    running = [h for h in list(EngineHost.instances) if h.thread.isRunning()]
    for host in running:
        host.shutdown(30_000)
    assert not running, f"{len(running)} engine thread(s) still running after the test"


def wait_idle(qtbot, window, timeout=120_000):
    qtbot.waitUntil(lambda: window.active_job is None, timeout=timeout)


def run_demo(qtbot, window, prompt="def add(a, b):", max_new_tokens=30, draft_length=3, timeout=180_000):
    """Run the demo's two lanes as a user does (its button) and return the result once the window
    is idle again. ``draft_length``: fixed (drafting whatever the tiny models cost; 0: Auto)."""
    window.demo.prompt.setPlainText(prompt)
    window.demo.controls.max_new_tokens.setValue(max_new_tokens)
    window.demo.controls.draft_length.setValue(draft_length)
    with qtbot.waitSignal(window.demo_finished, timeout=timeout) as finished:
        window.demo.run_button.click()
    wait_idle(qtbot, window)
    return finished.args[0]


@pytest.fixture()
def make_window(qtbot, app_settings, tiny_dirs):
    """A window with the tiny pair loaded (fp32 unless asked otherwise)."""
    from app.bridge import jobs
    from app.shell.window import MainWindow

    made = []  # strong refs: a window garbage-collected unclosed would never stop its thread

    def make(precision="fp32", load=True, settings=None):
        window = MainWindow(settings or app_settings, autoload=False)
        made.append(window)
        qtbot.addWidget(window)
        window.show()
        if load:
            with qtbot.waitSignal(window.model_loaded, timeout=120_000):
                window._submit("load", jobs.load_models(str(tiny_dirs[0]), str(tiny_dirs[1]), precision))
            wait_idle(qtbot, window)
        return window

    yield make
    for window in made:
        window.close()


@pytest.fixture()
def real_pair_window(qtbot, app_settings):
    """The main window with the real default pair loaded, its local-model scan done and idle
    (the slow tests' starting point); closed afterwards."""
    from engine.models.loading import default_pair

    if default_pair.installed_paths() is None:
        pytest.fail("the default pair is not installed: run the set-up (make setup) first")
    from app.shell.window import MainWindow

    window = MainWindow(app_settings, autoload=True)
    qtbot.addWidget(window)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.loaded is not None, timeout=600_000)
        # The local-model scan follows the first load (once); what a test measures comes after.
        qtbot.waitUntil(lambda: window.models.local_listed, timeout=60_000)
        wait_idle(qtbot, window, timeout=600_000)
        yield window
    finally:
        window.close()
