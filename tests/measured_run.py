"""A command run as a user runs it, with its own peak RSS and a cap on its address space.

Why not ``os.wait4`` on the command itself: Linux carries a process's high-water mark across
``exec``, and a child forked from pytest starts with pytest's pages counted. A pytest that has
loaded models holds 2 GiB, so every child "peaked" at 2 GiB before it ran a line. Here a small
launcher (a bare interpreter of a few MiB) forks the command instead, so the peak it reaps is the
command's own, give or take the launcher's size.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Runs in the launcher: cap the address space, fork, exec the command, reap it with wait4 and
#: write its peak RSS (kB on Linux) and exit status (negative: the signal that ended it) to the
#: file named first.
_LAUNCHER = """
import os, resource, sys
report, cap, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
if cap:
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
pid = os.fork()
if pid == 0:
    try:
        os.execv(argv[0], argv)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as f:
    f.write(f"{usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
"""


@dataclass(frozen=True)
class MeasuredRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss: int  # bytes: the command's own high-water mark


def run_measured(argv: list[str], *, cwd: Path | str, env: dict[str, str] | None = None, timeout: float = 120,
                 address_cap: int = 0) -> MeasuredRun:
    """Run ``argv`` (its first item a path to an executable); pytest.fail where it is still running
    after ``timeout`` s. ``address_cap`` > 0 bounds its address space, so that a read without bound
    fails instead of filling this machine's memory."""
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err:
        report = Path(folder) / "reaped"
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _LAUNCHER, str(report), str(address_cap), *argv],
                                cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the command it forked
            proc.wait()
            pytest.fail(f"{' '.join(argv[1:])} was still running after {timeout:.0f} s")
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        if not report.exists():
            pytest.fail(f"the launcher of {argv[1:]} ended without reaping it (status {proc.returncode})")
        peak_kb, returncode = map(int, report.read_text().split())
        return MeasuredRun(returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                           seconds, peak_kb * 1024)
