"""`python -m app`: start Tandem's window.

--screenshot OUT.png [--demo PROMPT] [--tab NAME]: run the app, optionally run the side-by-side
demo to completion, save a screenshot of the window and exit (docs and visual checks).
--target PATH [--drafter PATH]: load these models (folders or .gguf files) instead of the default
offline pair; a .gguf target runs its own quantization (--precision file) unless told otherwise.
--self-test [OUT.png]: build a tiny model pair, run the demo with and without speculation, exit 0
only when both outputs are identical (see app/shell/self_test.py; the packaged app's smoke test).
"""
from __future__ import annotations

import argparse
import datetime
import faulthandler
import logging
import logging.handlers
import sys
import traceback
from pathlib import Path

from engine.core.settings import PRECISIONS, precision_name

TABS = {"models": 0, "demo": 1, "chat": 2}
# The desktop file, icon and AppStream id (resources/linux/): one name, so the menu, the dock and
# software centres see one app.
APP_ID = "io.github.tandem.Tandem"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tandem-app", description="Tandem: fast local models with speculative decoding")
    p.add_argument("--screenshot", type=Path, help="save a screenshot of the window to this PNG and exit")
    p.add_argument("--demo", metavar="PROMPT", help="run the side-by-side demo on PROMPT (with --screenshot: to completion)")
    p.add_argument("--chat", metavar="MESSAGE", help="send MESSAGE in a new chat (with --screenshot: until the reply ends)")
    p.add_argument("--tab", choices=sorted(TABS), help="show this tab")
    p.add_argument("--select", metavar="TEXT", help="on the Models tab, select the first row that mentions TEXT "
                   "(its name, variant, source or drafter)")
    p.add_argument("--target", type=Path, help="load this model (a folder or a .gguf file) instead of the default pair")
    p.add_argument("--drafter", type=Path, help="draft model (a folder or a .gguf file) to go with --target")
    p.add_argument("--precision", type=precision_name, choices=PRECISIONS,
                   help="file (a GGUF file's own quantization: a .gguf target's default), bf16, fp32, int8 or int4 "
                        "(quantized target weights: smaller and faster, different output); fast and exact are "
                        "accepted for bf16 and fp32")
    p.add_argument("--max-new-tokens", type=int, help="reply length for --demo / --chat")
    p.add_argument("--timeout", type=float, default=1800, help="give up on --screenshot after this many seconds")
    p.add_argument("--self-test", nargs="?", const=True, type=Path, metavar="OUT.png",
                   help="check this build end to end on a tiny model (screenshot to OUT.png, default: the log dir); exit 0 when it passes")
    return p.parse_args(argv)


def target_precision(args: argparse.Namespace, app_choice: str) -> str:
    """The precision a --target loads at: --precision if given; else a .gguf file's own
    quantization (it runs at no other without its converted folder), a folder the app's choice."""
    if args.precision:
        return args.precision
    return "file" if args.target.suffix.lower() == ".gguf" else app_choice


# The log files' caps: a long-running app must never fill the disk with them.
LOG_MAX_BYTES = 5 * 1024 * 1024
LOG_BACKUPS = 3  # tandem.log.1 .. .3: 20 MB in all at most
CRASH_LOG_MAX_BYTES = 1024 * 1024  # crash.log, plus the one before it as crash.log.1


def setup_logging() -> Path | None:
    """tandem.log (rotating), stderr, and crash.log; the log file's path, None when it cannot be
    written (a read-only or full disk never stops the app: it logs to stderr only then)."""
    from engine.core.paths import log_dir

    directory = log_dir()
    path = directory / "tandem.log"
    handlers: list[logging.Handler] = []
    crash = unwritable = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS,
                                                             encoding="utf-8"))
        crash = _open_crash_log(directory / "crash.log")
    except OSError as exc:
        unwritable = exc
    if sys.stderr is not None:  # None in a windowed (console-less) packaged build on Windows/macOS
        handlers.append(logging.StreamHandler(sys.stderr))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
        handlers=handlers or [logging.NullHandler()],
    )
    if unwritable is not None:
        logging.getLogger("tandem").warning("cannot write the log files in %s (%s): logging to stderr only",
                                            directory, unwritable)
    if crash is not None or sys.stderr is not None:
        faulthandler.enable(crash or sys.stderr)  # a hard crash (segfault) still leaves a readable trace

    def log_uncaught(kind, value, tb) -> None:
        text = "".join(traceback.format_exception(kind, value, tb))
        logging.getLogger("tandem").critical("uncaught error:\n%s", text)
        # crash.log too: the one file to ask a user for, whether Python or the process died. An
        # error repeating in a loop stops here at the cap; the rotating log still has every one.
        if crash is not None and crash.tell() < CRASH_LOG_MAX_BYTES:
            crash.write(f"{datetime.datetime.now().isoformat(timespec='seconds')} uncaught error:\n{text}\n")
            crash.flush()
        try:  # a GUI user sees it: a traceback on a console nobody reads tells them nothing
            from app.shell.crash_dialog import show_crash

            show_crash(f"{kind.__name__}: {value}", directory / "crash.log" if crash is not None else None)
        except Exception:  # the dialog must never turn one error into two
            logging.getLogger("tandem").exception("could not show the crash dialog")

    sys.excepthook = log_uncaught
    return None if unwritable else path


def _open_crash_log(path: Path):
    """crash.log for appending; one over its cap becomes crash.log.1 first (replacing the older one)."""
    if path.exists() and path.stat().st_size > CRASH_LOG_MAX_BYTES:
        path.replace(path.with_name(path.name + ".1"))
    return open(path, "a", encoding="utf-8")  # noqa: SIM115 (lives as long as the app)


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_logging()
    self_test = None
    if args.self_test:
        from app.shell.self_test import SelfTest

        self_test = SelfTest(args)  # fills in --target/--drafter/--demo/--screenshot
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.shell.window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Tandem")
    app.setOrganizationName("Tandem")
    app.setDesktopFileName(APP_ID)  # Wayland matches the window to the launcher and its icon by this
    icon = _icon()
    if icon is not None:
        app.setWindowIcon(icon)
    from app.shell.theme import follow_system

    follow_system(app)  # light or dark, as the system is, and when it switches
    window = MainWindow(self_test.settings() if self_test else None, autoload=args.target is None)
    if args.precision:
        window.demo.controls.set_precision(args.precision)
        window.precision_override = args.precision  # the default pair's own default would win otherwise
    if args.max_new_tokens:
        window.demo.controls.max_new_tokens.setValue(args.max_new_tokens)
    if args.tab:
        window.tabs.setCurrentIndex(TABS[args.tab])
    window.show()
    if args.target is not None:
        from app.bridge import jobs

        window._submit("load", jobs.load_models(str(args.target), str(args.drafter) if args.drafter else None,
                                                target_precision(args, window.demo.controls.precision.currentData())))
    script = Script(window, args)
    window.model_loaded.connect(script.on_loaded)
    if self_test:
        self_test.attach(window, script)  # it judges the result, then ends the run
    else:
        window.demo_finished.connect(lambda _: script.done())
    if args.screenshot and not (args.demo or args.chat):
        # The picker has filled in: the catalog's rows and the GGUF files found on this machine.
        def shoot_picker() -> None:
            if args.select:
                window.models.select_matching(args.select)
            script.done()

        _when(lambda: window.last_report is not None and window.models.local_listed, shoot_picker)
    elif args.screenshot:
        window.no_model.connect(lambda why: script.done(failed=why))  # fail now, not at the timeout
    if args.screenshot:
        QTimer.singleShot(int(args.timeout * 1000), lambda: script.done(failed="timed out"))
    try:
        code = app.exec() or script.exit_code
    finally:
        if self_test:
            self_test.cleanup()
    from app.bridge.worker import leave

    return leave(code)  # at once, even when the engine is inside a step that cannot be cancelled


class Script:
    """The --demo / --chat / --screenshot sequence, driven by the window's own signals."""

    def __init__(self, window, args) -> None:
        self.window, self.args = window, args
        self.exit_code = 0
        self.started = False
        self.finishing = False

    def on_loaded(self, _loaded) -> None:
        if not self.started:
            self.started = True
            _when(lambda: self.window.active_job is None, self.start)  # the load job ends first

    def start(self) -> None:
        w, a = self.window, self.args
        if a.demo:
            w.tabs.setCurrentIndex(TABS["demo"])
            w.demo.prompt.setPlainText(a.demo)
            w.demo.run_button.click()
        elif a.chat:
            w.tabs.setCurrentIndex(TABS["chat"])
            w.chat.new_chat()
            w.chat.input.setPlainText(a.chat)
            w.chat.send()
            if a.screenshot:
                w.chat.send_button.setEnabled(False)
                _when(lambda: not w.chat.running, self.done)

    def done(self, failed: str = "") -> None:
        if not self.args.screenshot or self.finishing:  # the first verdict wins (e.g. over the timeout)
            return
        self.finishing = True
        from PySide6.QtCore import QTimer

        def shoot() -> None:
            path = self.args.screenshot
            path.parent.mkdir(parents=True, exist_ok=True)
            ok = self.window.grab().save(str(path))
            print(f"screenshot {'saved to' if ok else 'FAILED:'} {path}" + (f" ({failed})" if failed else ""), file=sys.stderr)
            self.exit_code = 0 if ok and not failed else 1
            self.window.close()
            from PySide6.QtWidgets import QApplication

            QApplication.instance().exit(self.exit_code)

        QTimer.singleShot(300, shoot)  # let the last repaint land


def _when(condition, then) -> None:
    from PySide6.QtCore import QTimer

    timer = QTimer()
    timer.setInterval(200)

    def check() -> None:
        if condition():
            timer.stop()
            then()

    timer.timeout.connect(check)
    timer.start()
    _when.keep = getattr(_when, "keep", []) + [timer]  # keep the timer alive


def _icon():
    from PySide6.QtGui import QIcon

    from engine.core.paths import RESOURCES

    path = RESOURCES / "icons" / "tandem.svg"
    return QIcon(str(path)) if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
