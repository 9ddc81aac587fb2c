"""Hub downloads against a real HTTP server on loopback (tests/engine/hub/hub_server.py).

huggingface_hub itself talks to the server (HF_ENDPOINT points there): nothing of it is mocked.
The served models are tiny random ones built offline, so every test runs in about a second.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from engine.hub import download as hub
from engine.hub import transfer
from engine.hub.cache import hub_cache_dir
from engine.hub.download import (
    DownloadFailed,
    DownloadFinished,
    DownloadProgress,
    DownloadStarted,
    HubError,
    download,
    download_events,
    fetch_events,
    is_installed,
    plan_download,
)

pytestmark = pytest.mark.timeout(120)
from tests.engine.conftest import (  # the served repos (fake_hub fixture)
    DRAFTER,
    OTHER_VOCAB,
    TARGET,
    WEIGHTS,
)
from tests.paths import REPO_ROOT


def run(plan, cancel=None, **kwargs):
    return list(download_events(plan, cancel or threading.Event(), **kwargs))


def weights_gets(server, repo=TARGET):
    return server.gets(repo, WEIGHTS)


# --- the happy path ----------------------------------------------------------------------------

def test_downloads_target_and_drafter_with_progress_and_marks_them_installed(fake_hub, model_dirs):
    fake_hub.rate_bps = 4_000_000  # ~0.4 s in all, so a few progress events show up
    plan = plan_download(TARGET, drafter_repo=DRAFTER)
    assert plan.drafter.repo == DRAFTER and plan.drafter_kind == "draft_model"
    assert is_installed(TARGET) is None

    events = run(plan)

    assert isinstance(events[0], DownloadStarted) and events[0].total_bytes == plan.total_bytes
    assert isinstance(events[-1], DownloadFinished), events[-1]
    progress = [e for e in events if isinstance(e, DownloadProgress)]
    assert progress and progress[-1].bytes_done == progress[-1].bytes_total == plan.total_bytes
    assert [p.bytes_done for p in progress] == sorted(p.bytes_done for p in progress)
    assert len(progress) <= events[-1].seconds / hub.PROGRESS_INTERVAL_S + 2  # throttled
    assert any(p.rate_bps > 0 and p.eta_s is not None for p in progress[:-1])

    done = events[-1]
    assert done.same_tokenizer is True and done.bytes_downloaded == plan.total_bytes
    for folder, source in ((done.target_path, model_dirs["target"]), (done.drafter_path, model_dirs["drafter"])):
        for f in source.iterdir():
            assert (folder / f.name).read_bytes() == f.read_bytes()
    assert is_installed(TARGET) == done.target_path
    assert is_installed(DRAFTER) == done.drafter_path


def test_cache_is_shared_with_huggingface_hub(fake_hub):
    """Files land in huggingface_hub's layout: its own functions find ours, and a file it
    fetched earlier is verified and reused, not fetched again."""
    from huggingface_hub import hf_hub_download

    cache = str(hub_cache_dir())
    hf_hub_download(TARGET, WEIGHTS, cache_dir=cache, endpoint=fake_hub.url)
    assert len(weights_gets(fake_hub)) == 1

    done = download(TARGET, drafter=False)

    assert len(weights_gets(fake_hub)) == 1  # reused
    for f in done.target_path.iterdir():
        found = hf_hub_download(TARGET, f.name, cache_dir=cache, local_files_only=True)
        assert Path(found).read_bytes() == f.read_bytes()


def test_only_needed_files_are_fetched(fake_hub, model_dirs):
    fake_hub.add_repo("org/busy", model_dirs["target"], extra={
        "onnx/model.onnx": b"onnx" * 100, "model.Q4_K_M.gguf": b"GGUF" * 100, "pytorch_model.bin": b"pt" * 100,
        "README.md": b"# busy", "original/consolidated.pth": b"x" * 100, "model.fp16.safetensors": b"fp16" * 100,
    })
    plan = plan_download("org/busy", drafter=False)
    names = {f.path for f in plan.target.files}
    assert names == {p.name for p in model_dirs["target"].iterdir()}
    assert isinstance(run(plan)[-1], DownloadFinished)


def test_drafter_found_by_convention_or_inside_the_repo(fake_hub, model_dirs):
    fake_hub.add_repo("org/tiny-assistant", model_dirs["drafter"])
    plan = plan_download(TARGET)
    assert (plan.drafter.repo, plan.drafter_kind, plan.drafter_source) == ("org/tiny-assistant", "assistant", "convention")

    mtp = {f"mtp/{p.name}": p.read_bytes() for p in model_dirs["drafter"].iterdir()}
    fake_hub.add_repo("org/with-mtp", model_dirs["target"], extra=mtp)
    plan = plan_download("org/with-mtp")
    assert (plan.drafter.repo, plan.drafter.subfolder, plan.drafter_kind) == ("org/with-mtp", "mtp", "mtp")
    assert {f.path for f in plan.target.files}.isdisjoint(mtp)  # the sidecar is not part of the target
    done = run(plan)[-1]
    assert done.drafter_path == done.target_path / "mtp" and (done.drafter_path / WEIGHTS).exists()

    fake_hub.add_repo("org/lonely", model_dirs["target"])
    plan = plan_download("org/lonely")
    assert plan.drafter is None and plan.drafter_source == "none"


def test_catalog_pairing_is_used_when_the_catalog_knows_the_model(fake_hub, monkeypatch):
    entry = types.SimpleNamespace(id="tiny-pair", target_repo=TARGET, drafter_repo=DRAFTER, drafter_kind="draft_model")
    # Patch the real module: once imported, `from engine.models import catalog` reads the package
    # attribute, so swapping sys.modules alone would not be seen.
    from engine.models.planning import catalog
    monkeypatch.setattr(catalog, "find_entry", lambda key: entry if key in (entry.id, entry.target_repo) else None)

    plan = plan_download("tiny-pair")

    assert (plan.target.repo, plan.drafter.repo, plan.drafter_source) == (TARGET, DRAFTER, "catalog")


# --- interruptions -------------------------------------------------------------------------------

def test_cancel_is_prompt_mid_file_and_the_next_run_resumes_with_a_range_request(fake_hub):
    size = len(fake_hub.file(TARGET, WEIGHTS).data)
    fake_hub.rate_bps = 400_000  # the weights take ~2 s
    plan = plan_download(TARGET, drafter=False)
    cancel = threading.Event()
    events = []
    for event in download_events(plan, cancel):
        events.append(event)
        if (isinstance(event, DownloadProgress) and event.current_file.endswith(WEIGHTS)
                and event.bytes_done > plan.total_bytes - size + 100_000):
            cancel.set()
    assert isinstance(events[-1], DownloadFailed) and events[-1].kind == "cancelled"
    assert is_installed(TARGET) is None
    fake_hub.wait_idle()
    # Prompt: the body stopped where the cancel came, ~2 s of it unsent (not a clock's reading,
    # which a busy machine stretches, but what the server had left to send).
    (cancelled_get,) = weights_gets(fake_hub)
    assert cancelled_get.bytes_sent < size - 200_000

    fake_hub.rate_bps = None
    events = run(plan_download(TARGET, drafter=False))
    assert events[0].bytes_present > 100_000
    assert isinstance(events[-1], DownloadFinished)
    first, second = weights_gets(fake_hub)
    assert second.status == 206 and second.range.startswith("bytes=")
    resumed_from = int(second.range[len("bytes="):-1])
    assert resumed_from >= 100_000 and second.bytes_sent == size - resumed_from < size
    assert is_installed(TARGET) == events[-1].target_path


def test_cancel_is_prompt_even_while_the_server_sends_nothing(fake_hub, monkeypatch):
    # After 16 kB the server falls silent, the connection open, until this test lets it go; the
    # client's read would wait past the test's own timeout. A cancel that waited for the next
    # byte (or the read timeout) would hang here: this one must answer while the server is silent.
    monkeypatch.setattr(transfer, "READ_TIMEOUT_S", 3600.0)
    fake_hub.stall_file(TARGET, WEIGHTS, after_bytes=16_384, hold_s=3600.0)
    plan = plan_download(TARGET, drafter=False)
    cancel = threading.Event()
    partial = plan.cache / "models--org--tiny" / "blobs" / f"{fake_hub.file(TARGET, WEIGHTS).sha256}.incomplete"
    events = download_events(plan, cancel)
    for event in events:
        if partial.exists() and partial.stat().st_size > 0:
            break
    cancel.set()
    rest = list(events)
    assert isinstance(rest[-1], DownloadFailed) and rest[-1].kind == "cancelled"
    assert fake_hub.sending == 1  # answered while the server still held the silent body
    fake_hub.release_stalls()
    fake_hub.wait_idle()


def test_a_dropped_connection_is_resumed_within_the_same_download(fake_hub):
    size = len(fake_hub.file(TARGET, WEIGHTS).data)
    fake_hub.drop_file_once(TARGET, WEIGHTS, after_bytes=300_000)

    done = download(TARGET, drafter=False)

    first, second = weights_gets(fake_hub)
    assert (first.status, first.bytes_sent) == (200, 300_000)
    assert (second.status, second.range, second.bytes_sent) == (206, "bytes=300000-", size - 300_000)
    assert done.bytes_downloaded == done_total(done) and is_installed(TARGET)


def done_total(done: DownloadFinished) -> int:
    return sum(p.stat().st_size for p in done.target_path.iterdir())


# --- integrity -----------------------------------------------------------------------------------

def test_corrupted_bytes_are_detected_removed_and_never_installed(fake_hub):
    fake_hub.corrupt_file(TARGET, WEIGHTS)
    plan = plan_download(TARGET, drafter=False)

    failed = run(plan)[-1]

    assert isinstance(failed, DownloadFailed) and failed.kind == "corrupt" and WEIGHTS in failed.error
    blobs = hub_cache_dir() / "models--org--tiny" / "blobs"
    assert not any(p.name.startswith(fake_hub.file(TARGET, WEIGHTS).sha256) for p in blobs.iterdir())
    assert not (plan.target.path(plan.cache) / WEIGHTS).exists()
    assert is_installed(TARGET) is None

    fake_hub.corrupt.clear()  # a good copy is served again: the next run fetches it afresh
    assert download(TARGET, drafter=False).target_path == is_installed(TARGET)


def test_a_cached_file_changed_on_disk_is_not_installed_and_is_fetched_again(fake_hub):
    done = download(TARGET, drafter=False)
    weights = done.target_path / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[1000] ^= 0xFF
    weights.resolve().write_bytes(bytes(data))  # same size, different bytes
    assert is_installed(TARGET) is None

    again = download(TARGET, drafter=False)

    assert len(weights_gets(fake_hub)) == 2
    assert (again.target_path / WEIGHTS).read_bytes() == fake_hub.file(TARGET, WEIGHTS).data


def test_mismatched_tokenizer_drafter_is_refused_before_any_weights_are_fetched(fake_hub):
    plan = plan_download(TARGET, drafter_repo=OTHER_VOCAB)

    failed = run(plan)[-1]

    assert isinstance(failed, DownloadFailed) and failed.kind == "mismatch"
    assert "different tokenizer" in failed.error and "--cross-tokenizer" in failed.error
    assert not weights_gets(fake_hub, TARGET) and not weights_gets(fake_hub, OTHER_VOCAB)
    assert is_installed(OTHER_VOCAB) is None

    done = run(plan_download(TARGET, drafter_repo=OTHER_VOCAB, cross_tokenizer=True))[-1]
    assert isinstance(done, DownloadFinished) and done.same_tokenizer is False


# --- errors the user must act on -----------------------------------------------------------------

def test_unknown_repo_names_the_repo(fake_hub):
    with pytest.raises(HubError) as err:
        plan_download("org/no-such-model")
    assert err.value.kind == "not_found" and "org/no-such-model" in str(err.value)

    events = list(fetch_events("org/no-such-model", threading.Event()))  # the app's one-call form
    assert len(events) == 1 and events[0].kind == "not_found"


def test_gated_repo_explains_how_to_log_in_and_works_with_a_token(fake_hub, model_dirs, monkeypatch):
    fake_hub.add_repo("org/gated", model_dirs["target"], gated=True)
    with pytest.raises(HubError) as err:
        plan_download("org/gated", drafter=False)
    assert err.value.kind == "gated" and "hf auth login" in str(err.value) and "org/gated" in str(err.value)

    monkeypatch.setenv("HF_TOKEN", fake_hub.token)
    done = download("org/gated", drafter=False)
    assert (done.target_path / WEIGHTS).exists()
    assert all(e.authorized for e in fake_hub.requests() if e.kind == "resolve" and e.status in (200, 302))
    assert not any(e.authorized for e in fake_hub.requests() if e.kind == "cdn")  # the token stays on the Hub


def test_not_enough_disk_space_fails_before_fetching_anything(fake_hub):
    plan = plan_download(TARGET, drafter_repo=DRAFTER)

    events = run(plan, free_bytes=lambda path: 10_000)

    assert len(events) == 1 and isinstance(events[0], DownloadFailed) and events[0].kind == "disk_full"
    assert "disk space" in events[0].error and str(plan.cache) in events[0].error
    assert not [e for e in fake_hub.requests() if e.kind in ("resolve", "cdn")]


def test_offline_installed_models_work_and_missing_ones_fail_fast(fake_hub, monkeypatch):
    download(TARGET, drafter_repo=DRAFTER)
    seen = len(fake_hub.requests())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    plan = plan_download(TARGET)  # the remembered drafter, both from the local markers
    events = run(plan)

    assert plan.installed and plan.drafter.repo == DRAFTER
    assert isinstance(events[-1], DownloadFinished) and events[-1].bytes_downloaded == 0
    assert len(fake_hub.requests()) == seen  # no network at all
    with pytest.raises(HubError) as err:
        plan_download(OTHER_VOCAB)
    assert err.value.kind == "offline" and "HF_HUB_OFFLINE" in str(err.value) and OTHER_VOCAB in str(err.value)
    assert len(fake_hub.requests()) == seen  # failed without trying the network, so at once


def test_unreachable_hub_fails_fast_with_a_clear_message(fake_hub, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    waits = []  # fast: a refused connection is not retried after a back-off
    monkeypatch.setattr(time, "sleep", waits.append)
    with pytest.raises(HubError) as err:
        plan_download(TARGET)
    assert err.value.kind == "offline" and "Cannot reach" in str(err.value)
    assert waits == []


# --- the command line ----------------------------------------------------------------------------

def cli(*args: str, **popen) -> subprocess.Popen:
    # The worktree's engine (cwd on sys.path), not an installed `tandem` script.
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "download", *args], cwd=REPO_ROOT,
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_cli_download_then_load_and_generate(fake_hub):
    from engine.core.settings import DecodeSettings
    from engine.session.session import Session
    from tests.engine.helpers import run_to_end

    proc = cli(TARGET, "--drafter", DRAFTER)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    paths = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert "ETA" in err and "done in" in err

    session = Session.load(Path(paths["target"]), Path(paths["drafter"]), "exact", "cpu")
    settings = DecodeSettings(mode="greedy", max_new_tokens=24)
    prompt = session.encode("def add(a, b):")
    plain, _ = run_to_end(session.plain(prompt, settings))
    spec, _ = run_to_end(session.speculative(prompt, settings))
    assert plain.token_ids == spec.token_ids and len(plain.token_ids) > 0
    assert spec.stats.drafted > 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_cli_interrupted_then_rerun_resumes(fake_hub, sig):
    size = len(fake_hub.file(TARGET, WEIGHTS).data)
    fake_hub.rate_bps = 300_000
    partial = hub_cache_dir() / "models--org--tiny" / "blobs" / f"{fake_hub.file(TARGET, WEIGHTS).sha256}.incomplete"
    proc = cli(TARGET, "--no-drafter")
    deadline = time.monotonic() + 30
    while not (partial.exists() and partial.stat().st_size > 64_000):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=10)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "run the same command again to resume" in err
    assert partial.exists() and is_installed(TARGET) is None
    fake_hub.wait_idle()

    fake_hub.rate_bps = None
    rerun = cli(TARGET, "--no-drafter")
    out, err = rerun.communicate(timeout=60)
    assert rerun.returncode == 0, err
    assert "resuming" in err
    last = weights_gets(fake_hub)[-1]
    assert last.status == 206 and 0 < last.bytes_sent < size
    assert is_installed(TARGET) == Path(out.split("target: ", 1)[1].strip())


def test_cli_reports_errors_readably(fake_hub):
    proc = cli("org/no-such-model")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "org/no-such-model" in err and "Traceback" not in err
