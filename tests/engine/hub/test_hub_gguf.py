"""GGUF variants downloaded from the loopback fake Hub (tests/engine/hub/hub_server.py), then run.

The served repos hold tiny GGUF files written by gguf-py (engine/testing/tiny_gguf.py), several
quantizations side by side as on the Hub's GGUF repos, one of them split in parts. A variant
download fetches its file(s) and its drafter's file only, resumes a cut with a Range request,
checks every file against the listing's LFS sha256, and the result loads at precision "file".
"""
from __future__ import annotations

import hashlib
import threading
import types

import pytest

from engine.cli import main as cli_main
from engine.hub import transfer
from engine.hub.cache import hub_cache_dir, read_installed
from engine.hub.download import (
    DownloadFailed,
    DownloadFinished,
    DownloadNotice,
    DownloadProgress,
    DownloadStarted,
    HubError,
    download,
    download_events,
    fetch_events,
    is_installed,
)
from engine.hub.gguf_plan import GgufSource, plan_gguf_download, plan_variant_download
from tests.engine.hub.hub_server import FakeHub

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("one_torch_thread")]  # catches a hang; a loaded machine or a first kernel build can take minutes
from tests.engine.conftest import (  # the served GGUF files (gguf_files)
    DRAFT,
    DRAFT_Q8,
    SINGLE,
    SPLIT_PARTS,
)

REPO, DRAFTER_REPO = "org/tiny-GGUF", "org/tiny-drafter-GGUF"


def split_part(i: int) -> str:
    return f"tiny-Q8_0-{i:05d}-of-{SPLIT_PARTS:05d}.gguf"


def point_hf_at(tmp_path, monkeypatch) -> None:
    """A fresh Hub cache in tmp_path, no token, not offline (HF_ENDPOINT is set by the caller)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


@pytest.fixture
def hub(gguf_files, tmp_path, monkeypatch):
    """The two GGUF repos (with a README, as real ones have), the environment pointing at them
    and at a fresh Hub cache, and a catalog entry listing their variants."""
    point_hf_at(tmp_path, monkeypatch)
    target = {n: d for n, d in gguf_files.items() if not n.startswith("tiny-drafter")}
    drafter = {n: d for n, d in gguf_files.items() if n.startswith("tiny-drafter")}
    with FakeHub() as server:
        server.add_repo(REPO, extra={**target, "README.md": b"# tiny GGUF"})
        server.add_repo(DRAFTER_REPO, extra={**drafter, "README.md": b"# tiny drafter GGUF"})
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        use_catalog(monkeypatch, entry(server))
        yield server


def variant(server: FakeHub, repo: str, quant: str, *names: str) -> GgufSource:
    return GgufSource(quant, repo, names, sum(len(server.file(repo, n).data) for n in names))


def entry(server: FakeHub, **changes):
    """A catalog entry with GGUF variants for the target and its drafter, in the catalog's shape."""
    parts = [split_part(i) for i in range(1, SPLIT_PARTS + 1)]
    fields = {
        "id": "tiny-gguf", "target_repo": "org/tiny", "drafter_repo": "org/tiny-drafter", "drafter_kind": "draft_model",
        "variants": (variant(server, REPO, "Q4_0", SINGLE), variant(server, REPO, "Q8_0", *parts)),
        "drafter_variants": (variant(server, DRAFTER_REPO, "Q8_0", DRAFT_Q8), variant(server, DRAFTER_REPO, "Q4_0", DRAFT)),
    }
    return types.SimpleNamespace(**{**fields, **changes})


def use_catalog(monkeypatch, *entries) -> None:
    from engine.models.planning import catalog

    by_key = {key: e for e in entries for key in (e.id, e.target_repo)}
    monkeypatch.setattr(catalog, "find_entry", lambda key: by_key.get(key))


def run(plan, cancel=None) -> list:
    return list(download_events(plan, cancel or threading.Event()))


def body_gets(server: FakeHub) -> list:
    return [e for e in server.requests() if e.method == "GET" and e.kind in ("cdn", "resolve") and e.status in (200, 206)]


def blobs(repo: str):
    return hub_cache_dir() / ("models--" + repo.replace("/", "--")) / "blobs"


def assert_greedy_speculation_equals_plain(target_path, drafter_path) -> None:
    from engine.core.settings import DecodeSettings
    from engine.session.compare import compare
    from engine.session.session import Session

    session = Session.load(target_path, drafter_path, "file", "cpu")
    assert session.precision == "file"
    result = compare(session, "def add(a, b):", DecodeSettings(max_new_tokens=24, draft_length=3))
    assert result.speculative.token_ids == result.plain.token_ids and len(result.plain.token_ids) > 0
    assert result.speculative.stats.accepted > 0


# --- the whole path ----------------------------------------------------------------------------

def test_variant_and_drafter_cut_resumed_verified_then_loaded_and_generating(hub, monkeypatch):
    size = len(hub.file(REPO, SINGLE).data)
    hub.drop_file_once(REPO, SINGLE, after_bytes=40_000)
    monkeypatch.setattr(transfer, "RETRIES", 0)  # the cut ends this run: the next one resumes it
    plan = plan_variant_download("tiny-gguf", "q4_0")
    assert [f.path for f in plan.target.files] == [SINGLE] and [f.path for f in plan.drafter.files] == [DRAFT]
    assert plan.total_bytes == size + len(hub.file(DRAFTER_REPO, DRAFT).data)
    assert all(f.sha256 == hub.file(u.repo, f.path).sha256 for u in plan.units for f in u.files)  # the listing's LFS sha256

    cut = run(plan)[-1]

    assert isinstance(cut, DownloadFailed) and cut.kind == "network" and "40,000 of" in cut.error
    assert (blobs(REPO) / f"{hub.file(REPO, SINGLE).sha256}.incomplete").stat().st_size == 40_000
    assert is_installed(REPO) is None and is_installed(DRAFTER_REPO) is None
    hub.wait_idle()

    monkeypatch.setattr(transfer, "RETRIES", 3)
    events = run(plan_variant_download("tiny-gguf", "Q4_0"))

    assert isinstance(events[0], DownloadStarted) and events[0].bytes_present == 40_000
    done = events[-1]
    assert isinstance(done, DownloadFinished), done
    assert done.target_path.name == SINGLE and done.drafter_path.name == DRAFT
    assert done.bytes_downloaded == plan.total_bytes - 40_000
    first, second = [e for e in body_gets(hub) if e.path == SINGLE]
    assert (first.status, first.bytes_sent) == (200, 40_000)
    assert (second.status, second.range, second.bytes_sent) == (206, "bytes=40000-", size - 40_000)
    assert {(e.repo, e.path) for e in body_gets(hub)} == {(REPO, SINGLE), (DRAFTER_REPO, DRAFT)}  # nothing else
    for path, repo, name in ((done.target_path, REPO, SINGLE), (done.drafter_path, DRAFTER_REPO, DRAFT)):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == hub.file(repo, name).sha256
    assert is_installed(REPO, precision="Q4_0") == done.target_path
    assert is_installed(DRAFTER_REPO, precision="Q4_0") == done.drafter_path

    assert_greedy_speculation_equals_plain(done.target_path, done.drafter_path)

    seen = len(hub.requests())  # installed: planned again without the network
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = run(plan_variant_download("tiny-gguf", "Q4_0"))[-1]
    assert again.target_path == done.target_path and again.bytes_downloaded == 0 and len(hub.requests()) == seen


def test_a_split_variant_fetches_all_its_parts_and_loads_from_the_first(hub):
    q4 = download("tiny-gguf", variant="Q4_0", drafter=False)
    plan = plan_variant_download("tiny-gguf", "Q8_0")

    parts = [split_part(i) for i in range(1, SPLIT_PARTS + 1)]
    assert [f.path for f in plan.target.files] == parts
    assert plan.target.size == sum(len(hub.file(REPO, p).data) for p in parts)
    by_first_part = plan_gguf_download(GgufSource("Q8_0", REPO, (split_part(1),)))  # the first part brings the rest
    assert by_first_part.target.files == plan.target.files
    assert [f.path for f in plan.drafter.files] == [DRAFT_Q8]  # the drafter variant of the same quantization
    done = run(plan)[-1]

    assert isinstance(done, DownloadFinished) and done.target_path.name == split_part(1)
    for i in range(1, SPLIT_PARTS + 1):
        part = done.target_path.with_name(split_part(i))
        assert part.read_bytes() == hub.file(REPO, split_part(i)).data
    # Both quantizations of the repo are installed side by side.
    assert is_installed(REPO, precision="Q8_0") == done.target_path
    assert is_installed(REPO, precision="Q4_0") == q4.target_path
    assert_greedy_speculation_equals_plain(done.target_path, done.drafter_path)


# --- integrity ----------------------------------------------------------------------------------

def test_a_copy_spoiled_on_the_way_is_deleted_and_fetched_again_with_a_notice(hub):
    hub.corrupt_file(REPO, SINGLE, once=True)

    events = run(plan_variant_download("tiny-gguf", "Q4_0", drafter=False))

    notices = [e for e in events if isinstance(e, DownloadNotice)]
    assert len(notices) == 1 and SINGLE in notices[0].message and "sha256" in notices[0].message
    assert "fetching the file again" in notices[0].message
    done = events[-1]
    assert isinstance(done, DownloadFinished) and done.target_path.read_bytes() == hub.file(REPO, SINGLE).data
    assert [e.status for e in body_gets(hub)] == [200, 200]  # the second fetch starts from byte 0


def test_a_file_that_keeps_failing_its_sha256_is_removed_and_never_installed(hub):
    sha = hub.file(REPO, SINGLE).sha256
    hub.corrupt_file(REPO, SINGLE)
    plan = plan_variant_download("tiny-gguf", "Q4_0", drafter=False)

    failed = run(plan)[-1]

    assert isinstance(failed, DownloadFailed) and failed.kind == "corrupt"
    assert f"{REPO}/{SINGLE} is corrupted" in failed.error and "sha256" in failed.error and "fetched 2 times" in failed.error
    assert not any(p.name.startswith(sha) for p in blobs(REPO).iterdir())  # neither blob nor partial
    assert not plan.target.load_path(plan.cache).exists() and is_installed(REPO) is None


def test_a_finished_file_spoiled_on_disk_is_refetched_not_used(hub):
    done = download("tiny-gguf", variant="Q4_0", drafter=False)
    blob = done.target_path.resolve()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))  # same size, other bytes: bit rot, or another tool's write
    assert is_installed(REPO, precision="Q4_0") is None

    events = list(fetch_events("tiny-gguf", threading.Event(), variant="Q4_0", drafter=False))

    assert any(isinstance(e, DownloadNotice) and "copy on disk does not match" in e.message for e in events)
    assert isinstance(events[-1], DownloadFinished)
    assert events[-1].target_path.read_bytes() == hub.file(REPO, SINGLE).data
    assert len([e for e in body_gets(hub) if e.path == SINGLE]) == 2


# --- cancel --------------------------------------------------------------------------------------

def test_cancel_mid_file_keeps_a_resumable_partial_and_registers_nothing(hub):
    hub.rate_bps = 40_000  # the target's ~80 kB take ~2 s
    plan = plan_variant_download("tiny-gguf", "Q4_0")
    partial = blobs(REPO) / f"{hub.file(REPO, SINGLE).sha256}.incomplete"
    cancel, events = threading.Event(), []
    for event in download_events(plan, cancel):
        events.append(event)
        if isinstance(event, DownloadProgress) and partial.exists() and partial.stat().st_size >= 16_000:
            cancel.set()
    assert isinstance(events[-1], DownloadFailed) and events[-1].kind == "cancelled"
    hub.wait_idle()
    kept = partial.stat().st_size
    assert 0 < kept < len(hub.file(REPO, SINGLE).data)
    storage = blobs(REPO).parent
    assert not (storage / "snapshots").exists() and not (storage / "refs").exists()  # no pointer, no ref
    assert read_installed(REPO) is None and read_installed(DRAFTER_REPO) is None

    hub.rate_bps = None
    done = run(plan_variant_download("tiny-gguf", "Q4_0"))

    assert isinstance(done[0], DownloadStarted) and done[0].bytes_present == kept
    assert isinstance(done[-1], DownloadFinished)
    last = [e for e in body_gets(hub) if e.path == SINGLE][-1]
    assert (last.status, last.range) == (206, f"bytes={kept}-")


# --- what the user must act on --------------------------------------------------------------------

def test_a_variant_missing_on_the_hub_is_a_clear_error_before_any_transfer(hub, monkeypatch):
    gone = GgufSource("Q5_K_M", REPO, ("tiny-Q5_K_M.gguf",), 81_792)
    use_catalog(monkeypatch, entry(hub, variants=(gone,)))

    with pytest.raises(HubError) as err:
        plan_variant_download("tiny-gguf", "Q5_K_M")
    assert err.value.kind == "not_found"
    message = str(err.value)
    assert "tiny-Q5_K_M.gguf" in message and "Q5_K_M GGUF variant" in message and SINGLE in message

    with pytest.raises(HubError) as err:  # the variant's whole repo is gone
        plan_gguf_download(GgufSource("Q4_0", "org/no-such-GGUF", (SINGLE,)))
    assert err.value.kind == "not_found" and "org/no-such-GGUF" in str(err.value)
    assert not [e for e in hub.requests() if e.kind in ("resolve", "cdn")]


def test_not_enough_disk_space_for_the_variant_is_said_before_fetching(hub):
    plan = plan_variant_download("tiny-gguf", "Q4_0")

    events = list(download_events(plan, threading.Event(), free_bytes=lambda path: 1_000))

    assert len(events) == 1 and events[0].kind == "disk_full"
    assert f"Not enough disk space to download {REPO} (Q4_0 GGUF)" in events[0].error
    assert not [e for e in hub.requests() if e.kind in ("resolve", "cdn")]


def test_cli_downloads_a_variant_and_lists_the_variants_for_a_bad_name(hub, monkeypatch, capsys):
    assert cli_main(["download", "tiny-gguf", "--variant", "Q3_K_S"]) == 1
    err = capsys.readouterr().err
    assert "no GGUF variant 'Q3_K_S'" in err and "available: Q4_0, Q8_0" in err and "Traceback" not in err

    assert cli_main(["download", "tiny-gguf", "--variant", "Q4_0"]) == 0
    out, err = capsys.readouterr()
    paths = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert paths["target"].endswith(SINGLE) and paths["drafter"].endswith(DRAFT)
    assert "Q4_0 GGUF" in err and "done in" in err

    plain = types.SimpleNamespace(id="tiny-plain", target_repo="org/plain", drafter_repo=None, drafter_kind="lookup")
    use_catalog(monkeypatch, plain)
    assert cli_main(["download", "tiny-plain", "--variant", "Q4_0"]) == 1
    assert "tiny-plain has no GGUF variants" in capsys.readouterr().err


def test_transfers_show_progress_for_a_variant(hub):
    hub.rate_bps = 200_000
    events = run(plan_variant_download("tiny-gguf", "Q8_0"))
    progress = [e for e in events if isinstance(e, DownloadProgress)]
    assert progress and progress[-1].bytes_done == progress[-1].bytes_total == events[0].total_bytes
    assert [p.bytes_done for p in progress] == sorted(p.bytes_done for p in progress)
    assert any(p.current_file.startswith(f"{REPO}/tiny-Q8_0-") for p in progress)
    assert isinstance(events[-1], DownloadFinished)


# --- which files a variant means (no server) ------------------------------------------------------

def test_a_split_set_in_a_folder_is_completed_and_a_mixed_one_refused():
    from engine.hub.files import HubFile
    from engine.hub.gguf_plan import split_part_names, variant_files

    folder = "Big-Q8_0/Big-Q8_0-{:05d}-of-00003.gguf"
    listing = [HubFile(folder.format(i), 10 * i, sha256=f"{i:064x}") for i in (3, 1, 2)] + [HubFile("Big-Q4_K_M.gguf", 7)]
    assert split_part_names(folder.format(2)) == tuple(folder.format(i) for i in (1, 2, 3))
    assert split_part_names("Big-Q4_K_M.gguf") == ("Big-Q4_K_M.gguf",)

    picked = variant_files(GgufSource("Q8_0", "org/big", (folder.format(1),), 60), listing)
    assert [f.path for f in picked] == [folder.format(i) for i in (1, 2, 3)]

    with pytest.raises(HubError, match=r"Big-Q8_0-00003-of-00003\.gguf.*its GGUF files are: Big-Q4_K_M\.gguf"):
        variant_files(GgufSource("Q8_0", "org/big", (folder.format(1),)), listing[1:])  # a part is missing
    with pytest.raises(HubError, match="several models"):
        variant_files(GgufSource("Q8_0", "org/big", (folder.format(1), "Big-Q4_K_M.gguf")), listing)


def test_an_installed_marker_naming_a_file_outside_the_model_is_ignored(hub):
    import json

    from engine.hub import cache

    done = download("tiny-gguf", variant="Q4_0", drafter=False)
    assert is_installed(REPO) == done.target_path  # any precision: the one variant there is
    marker = cache._marker_path(REPO, None, "main", "Q4_0")
    data = json.loads(marker.read_text())
    for entry_file, extra in (("tiny-Q9.gguf", False), ("../../../escape.gguf", True)):
        edited = {**data, "entry_file": entry_file}
        if extra:  # listed among its files too: the path itself is refused
            edited["files"] = [*data["files"], {**data["files"][0], "path": entry_file}]
        marker.write_text(json.dumps(edited))
        assert read_installed(REPO, precision="Q4_0") is None and is_installed(REPO) is None
