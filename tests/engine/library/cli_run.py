"""The real CLI in a subprocess, as a user runs it, inside the stores the library tests isolate
(HOME, TANDEM_HOME, LLAMA_CACHE, OLLAMA_MODELS: set by the autouse fixture, inherited here)."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: A listing that reads something without bound fails under this cap instead of filling the machine.
ADDRESS_SPACE_CAP = 6 * 2**30


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss: int  # bytes, this process's own (wait4)


def tandem(*args: str, timeout: float = 120) -> Run:
    """``tandem ARGS`` (``python -m engine.cli``); pytest.fail where it runs past ``timeout``."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))

    env = dict(os.environ, HF_HUB_CACHE=os.environ.get("TANDEM_HOME", "/nonexistent") + "-hf-cache")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, env=env, stdout=out, stderr=err,
                                preexec_fn=cap)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() - start > timeout:
                proc.kill()
                proc.wait()
                pytest.fail(f"tandem {' '.join(args)} was still running after {timeout:.0f} s")
            time.sleep(0.02)
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return Run(proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"), seconds,
                   usage.ru_maxrss * 1024)


def profile(folder: Path) -> str:
    path = folder / "machine.json"
    path.write_text(json.dumps({"ram_gb": 16, "cpu_cores": 8}))
    return str(path)


def local_rows(folder: Path) -> dict[str, dict]:
    """``tandem models --json --precision file``'s local rows by path (it must exit 0)."""
    run = tandem("models", "--json", "--precision", "file", "--hardware", profile(folder))
    assert run.returncode == 0, run.stderr
    return {r["path"]: r for r in json.loads(run.stdout)["models"] if r["source"] not in ("hub", "pypi")}
