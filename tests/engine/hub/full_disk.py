"""A disk that really fills up mid-download: HF_HOME on a small tmpfs, in a private mount
namespace (``unshare -rm``: no root needed where unprivileged user namespaces are allowed).

``run_on_full_disk`` (the test's side) starts ``python -m tests.engine.hub.full_disk`` inside the
namespace. That child downloads a repo from the fake Hub (HF_ENDPOINT, which the test serves
slowly), fills the tmpfs once the weights' partial file has grown, lets the download fail,
frees the space and downloads again, then prints one JSON line of what happened. The kernel's
own ENOSPC is what the download meets: nothing is simulated.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from tests.paths import REPO_ROOT

TMPFS_MB = 80  # the download needs its size plus 64 MB of headroom free before it starts


def tmpfs_available(scratch: Path) -> bool:
    """Whether this machine lets us mount a tmpfs in a private user+mount namespace."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    point = scratch / "tmpfs-probe"
    point.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run([unshare, "-rm", "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs "$1"', "sh", str(point)],
                           capture_output=True, timeout=30, check=False)
    return probe.returncode == 0


def run_on_full_disk(hf_home: Path, repo: str, sha256: str, fill_after: int = 100_000, timeout: float = 120) -> dict:
    """Run the child under ``unshare -rm`` with ``hf_home`` a fresh tmpfs; returns its report."""
    hf_home.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={TMPFS_MB}m tmpfs "$1" && shift && exec "$@"'
    cmd = ["unshare", "-rm", "sh", "-c", script, "sh", str(hf_home),
           sys.executable, "-m", "tests.engine.hub.full_disk", repo, sha256, str(fill_after)]
    env = {**os.environ, "HF_HOME": str(hf_home)}
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"full-disk child failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fill(path: Path) -> int:
    """Write zeros until the disk is full; returns how many bytes fitted."""
    written = 0
    block = bytes(1 << 20)
    with open(path, "wb", buffering=0) as out:
        try:
            while True:
                written += out.write(block)
        except OSError:
            pass
    return written


def _child(repo: str, sha256: str, fill_after: int) -> dict:
    import hashlib

    from engine.hub.cache import hub_cache_dir
    from engine.hub.download import (
        DownloadFailed,
        DownloadFinished,
        download_events,
        is_installed,
        plan_download,
    )

    cache = hub_cache_dir()
    partial = cache / ("models--" + repo.replace("/", "--")) / "blobs" / f"{sha256}.incomplete"
    filler = cache.parent / "filler"
    filled, last = 0, None
    for event in download_events(plan_download(repo, drafter=False), threading.Event()):
        if not filled and partial.exists() and partial.stat().st_size > fill_after:
            filled = _fill(filler)
        last = event
    report = {
        "filled": filled,
        "first_kind": last.kind if isinstance(last, DownloadFailed) else type(last).__name__,
        "first_error": getattr(last, "error", ""),
        "kept": partial.stat().st_size if partial.exists() else -1,
        "installed_after_failure": is_installed(repo) is not None,
    }
    filler.unlink(missing_ok=True)
    again = list(download_events(plan_download(repo, drafter=False), threading.Event()))
    report["started_from"] = again[0].bytes_present if again else -1
    report["second_kind"] = type(again[-1]).__name__ if again else "none"
    ok = False
    if isinstance(again[-1], DownloadFinished):
        weights = [p for p in again[-1].target_path.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf")]
        ok = bool(weights) and all(hashlib.sha256(p.read_bytes()).hexdigest() == sha256 for p in weights)
    report["second_bytes_match"] = ok
    report["installed"] = is_installed(repo) is not None
    return report


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
