"""Quitting while the engine is inside a step it cannot cancel (a kernel's first compile) ends
the app at once and cleanly: no abort, no crash log, no compiler left running, and the next
start builds the kernel as if nothing had happened."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT as ROOT

# The app as `python -m app` runs it, with one addition: as soon as the engine has a compiler
# running (the first load of a GGUF target compiles its kernels), the window is closed, as a
# person closing it would. QUIT_WAIT_MS 0: closing does not wait for the compile to end.
LAUNCH = r"""
import sys
import psutil
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
import app.bridge.worker
from app.__main__ import main

app.bridge.worker.QUIT_WAIT_MS = 0
qt = QApplication(sys.argv[:1])
COMPILERS = ("cc1plus", "ninja", "c++", "g++", "gcc")

def close_when_compiling():
    names = [child.name() for child in psutil.Process().children(recursive=True)]
    if any(name in COMPILERS for name in names):
        print("closing while compiling:", sorted(set(names)), flush=True)
        for window in qt.topLevelWidgets():
            window.close()
        qt.quit()

timer = QTimer()
timer.timeout.connect(close_when_compiling)
timer.start(50)
sys.exit(main(["--target", sys.argv[1], "--tab", "chat"]))
"""


def compilers_under(build_root: Path) -> list:
    import psutil

    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if any(str(build_root) in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_quitting_during_a_kernel_build_ends_at_once_without_a_crash(tmp_path):
    from engine.testing.tiny_gguf import write_gguf_pair

    (tmp_path / "models").mkdir()
    target, _ = write_gguf_pair(tmp_path / "models")
    build_root = tmp_path / "torch-extensions"  # empty: the first load compiles the kernels
    home = tmp_path / "home"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(build_root), "HOME": str(home),
           "TANDEM_HOME": str(tmp_path / "tandem"), "QT_QPA_PLATFORM": "offscreen"}
    env.pop("XDG_STATE_HOME", None)
    env.pop("XDG_CACHE_HOME", None)
    run = subprocess.run([sys.executable, "-c", LAUNCH, str(target)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert "closing while compiling" in out, out[-3000:]
    assert run.returncode == 0, out[-3000:]
    assert "QThread: Destroyed" not in out
    assert "quit while the engine was busy" in out  # the abandoned-step path, not a normal stop
    crash_logs = [p for p in home.rglob("crash.log*") if p.stat().st_size] + \
                 [p for p in (tmp_path / "tandem").rglob("crash.log*") if p.stat().st_size]
    assert not crash_logs, [p.read_text()[-2000:] for p in crash_logs]
    assert not compilers_under(build_root), "a compiler the app started outlived it"

