"""The real CLI in a subprocess, as a user runs it, inside the stores the library tests isolate
(HOME, TANDEM_HOME, LLAMA_CACHE, OLLAMA_MODELS: set by the autouse fixture, inherited here)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.measured_run import MeasuredRun, run_measured
from tests.paths import REPO_ROOT as ROOT

#: A listing that reads something without bound fails under this cap instead of filling the machine.
ADDRESS_SPACE_CAP = 6 * 2**30


def tandem(*args: str, timeout: float = 120) -> MeasuredRun:
    """``tandem ARGS`` (``python -m engine.cli``); pytest.fail where it runs past ``timeout``."""
    env = dict(os.environ, HF_HUB_CACHE=os.environ.get("TANDEM_HOME", "/nonexistent") + "-hf-cache")
    return run_measured([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, env=env, timeout=timeout,
                        address_cap=ADDRESS_SPACE_CAP)


def profile(folder: Path) -> str:
    path = folder / "machine.json"
    path.write_text(json.dumps({"ram_gb": 16, "cpu_cores": 8}))
    return str(path)


def local_rows(folder: Path) -> dict[str, dict]:
    """``tandem models --json --precision file``'s local rows by path (it must exit 0)."""
    run = tandem("models", "--json", "--precision", "file", "--hardware", profile(folder))
    assert run.returncode == 0, run.stderr
    return {r["path"]: r for r in json.loads(run.stdout)["models"] if r["source"] not in ("hub", "pypi")}
