"""The registry (``library.json``) changed by several processes at once: every change lands,
under a lock that its holder's death releases; and a registered file that has gone missing is
listed as missing, still registered, until it is forgotten."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from engine.library import import_model
from engine.library.registry import registry_path

from .cli_run import ROOT, local_rows, tandem

PROCESSES, FILES_EACH = 4, 12

# Each writer waits for the start file, then registers its files one after another.
_WRITER = """
import os, sys, time
from pathlib import Path
start, paths = Path(sys.argv[1]), sys.argv[2:]
while not start.exists():
    time.sleep(0.001)
from engine.library import import_model
for path in paths:
    import_model(path)
"""


def test_imports_from_several_processes_at_once_all_land(ggufs, tmp_path):
    batches = []
    for p in range(PROCESSES):
        folder = tmp_path / f"writer{p}"
        folder.mkdir()
        batches.append([str(shutil.copy(ggufs["drafter"], folder / f"m{i:02d}.gguf")) for i in range(FILES_EACH)])
    start = tmp_path / "start"
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(start), *paths], cwd=ROOT, env=os.environ.copy(),
                                stderr=subprocess.PIPE) for paths in batches]
    time.sleep(3)  # every writer imported and waiting
    start.touch()
    for w in writers:
        assert w.wait(timeout=300) == 0, w.stderr.read().decode()
    registered = [m["path"] for m in json.loads(registry_path().read_text())["models"]]
    expected = sorted(p for paths in batches for p in paths)
    assert sorted(registered) == expected, f"{len(expected) - len(set(registered))} of {len(expected)} imports lost"


_HOLDER = """
import sys, time
from pathlib import Path
from engine.library.registry import registry_path
from engine.library.store import locked
with locked(registry_path()):
    Path(sys.argv[1]).touch()
    time.sleep(600)
"""


def test_an_import_waits_for_the_lock_and_goes_on_when_its_holder_dies(ggufs, tmp_path):
    first = shutil.copy(ggufs["target"], tmp_path / ggufs["target"].name)
    import_model(first)
    held = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(held)], cwd=ROOT, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120
        while not held.exists():
            assert holder.poll() is None and time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.05)
        second = shutil.copy(ggufs["drafter"], tmp_path / ggufs["drafter"].name)
        importer = subprocess.Popen([sys.executable, "-m", "engine.cli", "import", str(second)], cwd=ROOT,
                                    env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(8)  # well past its start-up: it has read the header and waits for the lock
        assert importer.poll() is None, importer.communicate()
        assert [m["path"] for m in json.loads(registry_path().read_text())["models"]] == [str(first)]
        os.kill(holder.pid, signal.SIGKILL)  # no cleanup runs: the OS releases the lock
        out, err = importer.communicate(timeout=60)
        assert importer.returncode == 0, err.decode()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
    assert [m["path"] for m in json.loads(registry_path().read_text())["models"]] == [str(first), str(second)]


def test_a_missing_file_is_listed_as_missing_until_forgotten(ggufs, tmp_path):
    kept = shutil.copy(ggufs["target"], tmp_path / ggufs["target"].name)
    (tmp_path / "usb").mkdir()
    gone = shutil.copy(ggufs["drafter"], tmp_path / "usb" / ggufs["drafter"].name)
    import_model(kept)
    import_model(gone)
    os.unlink(gone)

    rows = local_rows(tmp_path)
    assert rows[str(kept)]["problem"] is None
    assert rows[str(gone)]["problem"].startswith(f"{gone} is missing") and rows[str(gone)]["fit"] == "none"
    assert rows[str(gone)]["source"] == "imported"
    assert [m["path"] for m in json.loads(registry_path().read_text())["models"]] == [str(kept), str(gone)]
    run = tandem("import", "--forget", str(gone))
    assert run.returncode == 0, run.stderr
    assert [m["path"] for m in json.loads(registry_path().read_text())["models"]] == [str(kept)]
    assert str(gone) not in local_rows(tmp_path)
