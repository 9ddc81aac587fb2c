"""The app's log files are bounded: tandem.log rotates at a size cap with a fixed number of
backups, and crash.log is rotated at start when over its cap and stops growing past it in a run.
Each case runs the real set-up in a fresh interpreter (it installs process-wide hooks)."""
import os
import subprocess
import sys
from pathlib import Path

from app.__main__ import CRASH_LOG_MAX_BYTES, LOG_BACKUPS, LOG_MAX_BYTES
from tests.paths import REPO_ROOT as ROOT


def _run(tmp_path, code: str) -> Path:
    home = tmp_path / "home"
    err = tmp_path / "stderr.txt"
    with err.open("w") as stderr:
        result = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, env={**os.environ, "TANDEM_HOME": str(home)},
                                stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=120)
    assert result.returncode == 0, err.read_text()[-3000:]
    return home / "log"


def test_the_log_rotates_at_its_size_cap(tmp_path):
    record = 10_000
    records = (LOG_BACKUPS + 2) * LOG_MAX_BYTES // record  # well past the cap of all the files together
    logs = _run(tmp_path, "import logging; from app.__main__ import setup_logging; setup_logging(); "
                          f"log = logging.getLogger('filler'); [log.info('x' * {record}) for _ in range({records})]; "
                          "log.info('the last line')")
    files = sorted(p.name for p in logs.glob("tandem.log*"))
    assert files == ["tandem.log"] + [f"tandem.log.{i}" for i in range(1, LOG_BACKUPS + 1)]
    for name in files:
        assert (logs / name).stat().st_size <= LOG_MAX_BYTES, name
    assert "the last line" in (logs / "tandem.log").read_text()


def test_an_oversized_crash_log_is_rotated_at_start(tmp_path):
    logs = tmp_path / "home" / "log"
    logs.mkdir(parents=True)
    old = "old crash\n" * (CRASH_LOG_MAX_BYTES // 10 + 100)
    (logs / "crash.log").write_text(old)
    _run(tmp_path, "from app.__main__ import setup_logging; setup_logging()")
    assert (logs / "crash.log").stat().st_size == 0
    assert (logs / "crash.log.1").read_text() == old  # the previous crash is kept, once


def test_a_small_crash_log_is_kept_and_appended(tmp_path):
    logs = tmp_path / "home" / "log"
    logs.mkdir(parents=True)
    (logs / "crash.log").write_text("earlier crash\n")
    _run(tmp_path, "import sys; from app.__main__ import setup_logging; setup_logging(); "
                   "sys.excepthook(ValueError, ValueError('boom'), None)")
    text = (logs / "crash.log").read_text()
    assert text.startswith("earlier crash\n") and "ValueError: boom" in text
    assert not (logs / "crash.log.1").exists()


def test_crash_log_stops_growing_past_its_cap_within_a_run(tmp_path):
    """An error that repeats in a loop (a broken slot) must not fill the disk through crash.log."""
    big = "y" * 10_000
    repeats = 3 * CRASH_LOG_MAX_BYTES // len(big)
    logs = _run(tmp_path, "import sys; from app.__main__ import setup_logging; setup_logging(); "
                          f"[sys.excepthook(RuntimeError, RuntimeError('{big}'), None) for _ in range({repeats})]")
    assert (logs / "crash.log").stat().st_size <= CRASH_LOG_MAX_BYTES + 2 * len(big)
    assert (logs / "tandem.log").stat().st_size > CRASH_LOG_MAX_BYTES  # the rotating log still has them


def test_an_unwritable_log_dir_never_stops_the_app(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "log").write_text("a file where the log folder should be")
    _run(tmp_path, "import logging, sys; from app.__main__ import setup_logging; "
                   "assert setup_logging() is None; logging.getLogger('t').info('still here'); "
                   "sys.excepthook(ValueError, ValueError('boom'), None)")
    err = (tmp_path / "stderr.txt").read_text()
    assert "logging to stderr only" in err and "still here" in err and "ValueError: boom" in err
