"""The catalog's own GGUF variants (resources/catalog.json) through `tandem download`, from the
loopback fake Hub serving tiny GGUF files under the real repos' and files' names: the catalog's
entry, its default variant and its drafter's variant, with no test double for the catalog."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from engine.hub.cache import hub_cache_dir
from engine.hub.download import is_installed
from engine.models.planning.catalog import find_entry
from tests.engine.conftest import DRAFT, SINGLE
from tests.engine.hub.hub_server import FakeHub
from tests.engine.hub.test_hub_gguf import (
    assert_greedy_speculation_equals_plain,
    point_hf_at,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("one_torch_thread")]  # catches a hang; a loaded machine or a first kernel build can take minutes
CATALOG_ID = "qwen2.5-coder-1.5b"


@pytest.fixture
def catalog_hub(gguf_files, tmp_path, monkeypatch):
    """Every GGUF variant the catalog lists for the entry and its drafter, served as tiny files
    (the first variant of each: the tiny target and drafter; the others: another tiny file)."""
    entry = find_entry(CATALOG_ID)
    assert entry.variants and entry.drafter_variants, "the catalog lists GGUF variants for the default models"
    point_hf_at(tmp_path, monkeypatch)
    with FakeHub() as server:
        for variants, first in ((entry.variants, SINGLE), (entry.drafter_variants, DRAFT)):
            files = {"README.md": b"# GGUF builds"}
            for i, v in enumerate(variants):
                for name in v.files:
                    files[name] = gguf_files[first if i == 0 else "tiny-Q8_0-00001-of-00004.gguf"]
            server.add_repo(variants[0].repo, extra=files)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server, entry


def test_the_catalogs_first_variant_is_the_default_and_it_loads(catalog_hub, capsys):
    server, entry = catalog_hub
    target, drafter = entry.variants[0], entry.drafter_variants[0]

    assert cli_main(["download", CATALOG_ID]) == 0

    out, err = capsys.readouterr()
    assert f"variant: {target.quant} (GGUF" in err
    paths = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert Path(paths["target"]).name == target.files[0] and Path(paths["drafter"]).name == drafter.files[0]
    fetched = {(e.repo, e.path) for e in server.requests() if e.kind in ("cdn", "resolve") and e.status in (200, 206)}
    assert fetched == {(target.repo, target.files[0]), (drafter.repo, drafter.files[0])}  # one quantization each
    assert is_installed(target.repo, precision=target.quant) == Path(paths["target"])
    assert_greedy_speculation_equals_plain(Path(paths["target"]), Path(paths["drafter"]))


def test_variant_safetensors_asks_for_the_repos_own_weights(catalog_hub, capsys):
    # The fake Hub serves only the GGUF repos: the safetensors repo's absence is the proof.
    assert cli_main(["download", CATALOG_ID, "--variant", "safetensors", "--no-drafter"]) == 1
    err = capsys.readouterr().err
    assert "variant:" not in err and f"No model {find_entry(CATALOG_ID).target_repo!r}" in err


def interrupt_when(ready, timeout: float = 20.0) -> threading.Thread:
    """Send this process a real SIGINT (Ctrl-C) once ``ready()``: the CLI, running in the main
    thread, handles it as it would a key press."""
    def watch() -> None:
        deadline = time.monotonic() + timeout
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_mid_variant_then_the_same_command_resumes(catalog_hub, capsys):
    server, entry = catalog_hub
    target = entry.variants[0]
    data = server.file(target.repo, target.files[0]).data
    server.rate_bps = 30_000  # ~3 s for the tiny target
    partial = (hub_cache_dir() / ("models--" + target.repo.replace("/", "--")) / "blobs"
               / f"{server.file(target.repo, target.files[0]).sha256}.incomplete")
    watcher = interrupt_when(lambda: partial.exists() and partial.stat().st_size >= 16_000)

    assert cli_main(["download", CATALOG_ID, "--no-drafter"]) == 130

    watcher.join()
    assert "run the same command again to resume" in capsys.readouterr().err
    assert partial.exists() and is_installed(target.repo) is None
    server.wait_idle()

    server.rate_bps = None
    assert cli_main(["download", CATALOG_ID, "--no-drafter"]) == 0
    out, err = capsys.readouterr()
    assert "resuming" in err
    last = [e for e in server.requests() if e.path == target.files[0] and e.status in (200, 206)][-1]
    assert last.status == 206 and 0 < last.bytes_sent < len(data)
    assert Path(out.split("target: ", 1)[1].strip()).read_bytes() == data
