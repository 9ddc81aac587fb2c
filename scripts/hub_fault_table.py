"""Fault table for Hub downloads: each fault tried against the loopback fake Hub
(tests/engine/hub/hub_server.py), counting how often it was handled and whether data was lost.

handled: the fault was reported with the right failure kind and a message naming the repo (and
the file where there is one); for faults a retry can recover from, the same run or the next one
then completed with the Hub's bytes, resuming from the bytes already on disk.
data lost: any file outside the Hub cache and Tandem's cache created, changed or deleted, or a
model marked installed whose bytes differ from what the Hub published. Must be 0 everywhere.

    .venv/bin/python scripts/hub_fault_table.py [--kills 10] [--repeat 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.engine.hub.hub_server import FakeHub

REPO, WEIGHTS = "org/tiny", "model.safetensors"
VICTIMS = ("somewhere/config.json", "somewhere/model.safetensors", "victim", "victim.incomplete", "x", "hf-home/x")
SHA_VARIANTS = {"dotdot": "../../../../somewhere", "absolute": "{root}/somewhere", "uppercase": "ABCDEF" + "0" * 34,
                "short": "abc123", "missing": None}
NAME_VARIANTS = ["../../../../evil.safetensors", "/tmp/evil.safetensors", "sub/../../../evil.json", "..\\..\\evil.gguf",
                 "\\evil.safetensors", "C:evil.safetensors", "evil\0.json", "./config.json", "a//config.json"]
ETAG_VARIANTS = [(WEIGHTS, "../../../../victim"), (WEIGHTS, "{root}/victim"),
                 (WEIGHTS, "d41d8cd98f00b204e9800998ecf8427e"), ("config.json", "../../../../victim")]
REVISION_VARIANTS = ["../../../../x", "/x", "refs/../../../../x", "a/./b", "main/", "x..y", ".hidden", "a\\b", "a b",
                     "x.lock", "a:b", "@", "a@{1}", "ref\0", ""]


@dataclass
class Row:
    fault: str
    tried: int = 0
    handled: int = 0
    lost: int = 0
    notes: list[str] = field(default_factory=list)


class Trial:
    """A fresh HF_HOME, Tandem home and fake Hub, with victims planted where escapes land."""

    def __init__(self, base: Path, model_dir: Path, n: int) -> None:
        self.root = base / f"trial-{n}"
        self.root.mkdir()
        self.hub = FakeHub().start()
        self.hub.add_repo(REPO, model_dir)
        self.served = {p: f.data for p, f in self.hub.repos[REPO].files.items()}
        os.environ.update(HF_HOME=str(self.root / "hf-home"), TANDEM_HOME=str(self.root / "tandem-home"),
                          HF_ENDPOINT=self.hub.url)
        for name in VICTIMS:
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"precious\n")
        self.before = self.outside()

    def outside(self) -> dict[str, bytes]:
        caches = (self.root / "hf-home" / "hub", self.root / "tandem-home" / "cache")
        tree = {}
        for p in sorted(self.root.rglob("*")):
            if any(p.is_relative_to(c) for c in caches):
                continue
            if p.is_symlink():
                tree[str(p)] = b"-> " + str(p.readlink()).encode()
            elif p.is_file():
                tree[str(p)] = p.read_bytes()
        return tree

    def data_lost(self, revision: str = "main") -> bool:
        from engine.hub.download import is_installed

        if self.outside() != self.before:
            return True
        folder = is_installed(REPO, revision=revision)
        if folder is None:
            return False
        return any((folder / p).read_bytes() != data for p, data in self.served.items() if (folder / p).exists())

    def partial(self) -> Path:
        sha = self.hub.file(REPO, WEIGHTS).sha256
        return self.root / "hf-home" / "hub" / "models--org--tiny" / "blobs" / f"{sha}.incomplete"

    def fetch(self, **options) -> list:
        from engine.hub.download import fetch_events

        return list(fetch_events(REPO, threading.Event(), drafter=False, **options))

    def installed_right(self) -> bool:
        from engine.hub.download import is_installed

        folder = is_installed(REPO)
        return folder is not None and (folder / WEIGHTS).read_bytes() == self.served[WEIGHTS]

    def resumed_from(self, offset: int) -> bool:
        self.hub.wait_idle(10)
        return any(e.status == 206 and e.range == f"bytes={offset}-" for e in self.hub.gets(REPO, WEIGHTS))

    def close(self) -> None:
        self.hub.release_stalls()
        self.hub.close()


def failed_with(events, kind: str, *words: str) -> bool:
    last = events[-1] if events else None
    return (type(last).__name__ == "DownloadFailed" and last.kind == kind
            and all(w in last.error for w in words) and "Traceback" not in last.error)


def finished(events) -> bool:
    return bool(events) and type(events[-1]).__name__ == "DownloadFinished"


def cli(trial: Trial, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "download", REPO, "--no-drafter", *args], cwd=REPO_ROOT,
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --- the faults -----------------------------------------------------------------------------------

def kill9_then_resume(trial: Trial, row: Row, kills: int) -> None:
    """kill -9 the CLI mid-file ``kills`` times, each run resuming the last; then let it finish."""
    size = len(trial.served[WEIGHTS])
    trial.hub.rate_bps = 150_000
    kept, offsets = 0, []
    for i in range(kills):
        row.tried += 1
        target = max(size * (i + 1) // (kills + 2), kept + 1)  # kill points spread over the file
        proc = cli(trial)
        deadline = time.monotonic() + 60
        while not (trial.partial().exists() and trial.partial().stat().st_size >= target):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        now = trial.partial().stat().st_size if trial.partial().exists() else 0
        from engine.hub.download import is_installed
        ok = now >= kept and is_installed(REPO) is None and (kept == 0 or trial.resumed_from(kept))
        if not ok:
            row.notes.append(f"kill at {now:,} B (previous {kept:,}): installed={is_installed(REPO) is not None},"
                             f" resumed={kept == 0 or trial.resumed_from(kept)}")
        row.handled += ok
        kept = now
        offsets.append(now)
    row.notes.append("killed at " + ", ".join(f"{n // 1000}k" for n in offsets) + f" of {size // 1000}k")
    trial.hub.rate_bps = None
    proc = cli(trial)
    _, err = proc.communicate(timeout=60)
    done = proc.returncode == 0 and "resuming" in err and trial.resumed_from(kept) and trial.installed_right()
    if not done:
        row.handled -= 1  # the last kill counts as handled only if its resume completed
        row.notes.append(f"final resume failed: {err[-200:]!r}")
    row.lost += trial.data_lost()


def cut_connection(trial: Trial, row: Row, rng: random.Random) -> None:
    size = len(trial.served[WEIGHTS])
    at = rng.randrange(size // 10, size - size // 10)
    trial.hub.drop_file_once(REPO, WEIGHTS, after_bytes=at)
    row.tried += 1
    row.handled += finished(trial.fetch()) and trial.resumed_from(at) and trial.installed_right()
    row.lost += trial.data_lost()


def stall_once(trial: Trial, row: Row, rng: random.Random) -> None:
    size = len(trial.served[WEIGHTS])
    at = rng.randrange(size // 10, size - size // 10)
    trial.hub.stall_file(REPO, WEIGHTS, after_bytes=at)
    row.tried += 1
    events = trial.fetch()
    trial.hub.release_stalls()
    row.handled += finished(events) and trial.resumed_from(at) and trial.installed_right()
    row.lost += trial.data_lost()


def stall_forever(trial: Trial, row: Row, rng: random.Random) -> None:
    size = len(trial.served[WEIGHTS])
    at = rng.randrange(size // 10, size - size // 10)
    trial.hub.stall_file(REPO, WEIGHTS, after_bytes=at, times=1000)
    row.tried += 1
    failed = trial.fetch()
    kept = trial.partial().stat().st_size if trial.partial().exists() else -1
    trial.hub.release_stalls()
    ok = failed_with(failed, "network", f"{REPO}/{WEIGHTS}", "stopped sending") and kept == at
    row.handled += ok and finished(trial.fetch()) and trial.resumed_from(at) and trial.installed_right()
    row.lost += trial.data_lost()


def endless_body(trial: Trial, row: Row) -> None:
    size = len(trial.served[WEIGHTS])
    trial.hub.send_endless(REPO, WEIGHTS)
    row.tried += 1
    largest, stop = [0], threading.Event()

    def watch() -> None:  # the largest the partial file ever got
        while not stop.is_set():
            try:
                largest[0] = max(largest[0], trial.partial().stat().st_size)
            except FileNotFoundError:
                pass
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        failed = trial.fetch()
    finally:
        stop.set()
        watcher.join()
    trial.hub.wait_idle(10)
    sent = max(e.bytes_sent for e in trial.hub.gets(REPO, WEIGHTS))
    ok = failed_with(failed, "corrupt", f"{REPO}/{WEIGHTS}", "longer than") and not trial.partial().exists()
    row.notes.append(f"partial peaked at {largest[0] - size:+,} B vs the size")
    trial.hub.endless.clear()
    row.handled += ok and largest[0] <= size and sent < size + (16 << 20) and finished(trial.fetch()) and trial.installed_right()
    row.lost += trial.data_lost()


def overlong_declared(trial: Trial, row: Row) -> None:
    trial.hub.send_overlong(REPO, WEIGHTS, extra=5 << 20, declared=True)
    row.tried += 1
    ok = failed_with(trial.fetch(), "corrupt", f"{REPO}/{WEIGHTS}", "Content-Length") and not trial.partial().exists()
    trial.hub.overlong.clear()
    row.handled += ok and finished(trial.fetch()) and trial.installed_right()
    row.lost += trial.data_lost()


def corrupted_bytes(trial: Trial, row: Row) -> None:
    trial.hub.corrupt_file(REPO, WEIGHTS)
    row.tried += 1
    ok = failed_with(trial.fetch(), "corrupt", f"{REPO}/{WEIGHTS}") and not trial.partial().exists()
    trial.hub.corrupt.clear()
    row.handled += ok and finished(trial.fetch()) and trial.installed_right()
    row.lost += trial.data_lost()


def hostile(trial: Trial, row: Row, setup, revision: str = "main") -> None:
    setup(trial)
    row.tried += 1
    try:
        events = trial.fetch(revision=revision)
        row.handled += failed_with(events, "unsafe", REPO)
        if not failed_with(events, "unsafe", REPO):
            last = events[-1] if events else None
            row.notes.append(f"{type(last).__name__}: {getattr(last, 'error', '')[:80]}")
    except Exception as exc:  # noqa: BLE001 - a crash is a fault not handled, and the table goes on
        row.notes.append(f"raised {type(exc).__name__}: {exc}"[:100])
    row.lost += trial.data_lost(revision if revision else "main")


def endless_listing(trial: Trial, row: Row) -> None:
    trial.hub.endless_listing, trial.hub.endless_cap = True, 256 << 20  # past the client's 64 MB bound
    row.tried += 1
    events = trial.fetch()
    trial.hub.wait_idle(30)
    sent = max(e.bytes_sent for e in trial.hub.requests() if e.kind == "api")
    row.notes.append(f"server got {sent >> 20} MB out before the client hung up")
    row.handled += failed_with(events, "unsafe", REPO, "listing") and sent < trial.hub.endless_cap
    row.lost += trial.data_lost()


def full_disk(trial: Trial, row: Row) -> bool:
    from tests.engine.hub.full_disk import run_on_full_disk, tmpfs_available

    if not tmpfs_available(trial.root):
        row.notes.append("skipped: unshare -rm not allowed here")
        return False
    trial.hub.rate_bps = 300_000
    row.tried += 1
    report = run_on_full_disk(trial.root / "hf-home", REPO, trial.hub.file(REPO, WEIGHTS).sha256)
    ok = (report["first_kind"] == "disk_full" and f"{REPO}/{WEIGHTS}" in report["first_error"] and report["kept"] > 0
          and not report["installed_after_failure"] and report["second_kind"] == "DownloadFinished"
          and report["second_bytes_match"] and trial.resumed_from(report["kept"]))
    row.handled += ok
    row.lost += trial.data_lost()  # the tmpfs is gone now: what is left outside it is what counts
    return True


# --- driver ---------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME"):
        os.environ.pop(var, None)
    from engine.hub import transfer
    from engine.testing.tiny_models import save_pair

    transfer.READ_TIMEOUT_S, transfer.RETRIES = 0.5, 1  # stalls are noticed in half a second
    rng = random.Random(0)
    base = Path(tempfile.mkdtemp(prefix="hub-faults-"))
    model_dir, _ = save_pair(base / "models")
    rows: list[Row] = []
    counter = iter(range(10_000))

    def trial() -> Trial:
        return Trial(base, model_dir, next(counter))

    def run(row: Row, fn, *a) -> None:
        t = trial()
        try:
            fn(t, row, *a)
        except Exception as exc:  # noqa: BLE001 - counted as not handled; the table goes on
            row.notes.append(f"{fn.__name__} raised {type(exc).__name__}: {exc}"[:120])
            row.lost += t.data_lost()
        finally:
            t.close()

    started = time.monotonic()
    rows.append(row := Row(f"kill -9 mid-file x{args.kills}, then resume"))
    run(row, kill9_then_resume, args.kills)
    for name, fn in (("cut connection", cut_connection), ("stall once (same run resumes)", stall_once),
                     ("stall forever (fails, rerun resumes)", stall_forever)):
        rows.append(row := Row(name))
        for _ in range(args.repeat):
            run(row, fn, rng)
    for name, fn in (("endless body", endless_body), ("Content-Length past the end", overlong_declared),
                     ("endless file listing (model info)", endless_listing), ("corrupted bytes", corrupted_bytes)):
        rows.append(row := Row(name))
        for _ in range(args.repeat):
            run(row, fn)
    rows.append(row := Row("hostile commit id (sha)"))
    for sha in SHA_VARIANTS.values():
        run(row, hostile, lambda t, s=sha: t.hub.serve_commit_as(REPO, s if s is None else s.format(root=t.root)))
    rows.append(row := Row("hostile file name (rfilename)"))
    for name in NAME_VARIANTS:
        run(row, hostile, lambda t, n=name: t.hub.add_repo(REPO, model_dir, extra={n: b"evil" * 100}))
    rows.append(row := Row("hostile ETag"))
    for path, etag in ETAG_VARIANTS:
        run(row, hostile, lambda t, p=path, e=etag: t.hub.send_etag_as(REPO, p, e.format(root=t.root)))
    rows.append(row := Row("hostile listed hash (lfs sha256 / blobId)"))
    for path in (WEIGHTS, "config.json"):
        run(row, hostile, lambda t, p=path: t.hub.list_hash_as(REPO, p, "../../../../victim"))
    rows.append(row := Row("hostile revision (server answers any)"))
    for rev in REVISION_VARIANTS:
        run(row, hostile, lambda t: setattr(t.hub, "any_revision", True), rev)
    rows.append(row := Row("full disk mid-file (real ENOSPC), then resume"))
    for _ in range(args.repeat):
        t = trial()
        try:
            if not full_disk(t, row):
                break
        except Exception as exc:  # noqa: BLE001 - counted as not handled; the table goes on
            row.notes.append(f"raised {type(exc).__name__}: {exc}"[:120])
        finally:
            t.close()

    print("| fault | tried | handled | data lost | notes |\n|---|---|---|---|---|")
    for r in rows:
        notes = "; ".join(dict.fromkeys(r.notes))[:160]
        print(f"| {r.fault} | {r.tried} | {r.handled} | {r.lost} | {notes} |")
    print(f"\n{sum(r.tried for r in rows)} tried, {sum(r.handled for r in rows)} handled,"
          f" {sum(r.lost for r in rows)} with data lost; {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return 0 if all(r.lost == 0 and r.handled == r.tried for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
