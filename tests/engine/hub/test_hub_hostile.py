"""Downloads from a hostile or broken Hub (tests/engine/hub/hub_server.py's hostile modes).

Whatever the server answers, nothing outside the Hub cache is created, replaced or deleted,
and nothing it sent that does not check out is marked installed. Every test plants a "victim"
file where a path-traversal would land and checks it survives byte for byte.
"""
from __future__ import annotations

import hashlib
import threading
import time

import pytest

from engine.hub import transfer
from engine.hub.cache import hub_cache_dir
from engine.hub.download import (
    DownloadFailed,
    DownloadFinished,
    HubError,
    download,
    fetch_events,
    is_installed,
    plan_download,
)
from tests.engine.conftest import TARGET, WEIGHTS
from tests.engine.hub.test_hub import cli, weights_gets

pytestmark = pytest.mark.timeout(60)
PRECIOUS = b"precious bytes that no download may touch\n"


def plant_victims(root, *names: str) -> dict:
    """Files where an escaping path would land; returns {path: bytes} to compare later."""
    planted = {}
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(PRECIOUS)
        planted[path] = PRECIOUS
    return planted


def outside_cache_unchanged(tmp_path, before: dict[str, bytes]) -> bool:
    return tree_outside_cache(tmp_path) == before


def tree_outside_cache(tmp_path) -> dict[str, bytes]:
    """Every file under tmp_path outside the Hub cache and Tandem's cache, with its bytes."""
    caches = (hub_cache_dir(), tmp_path / "tandem-home" / "cache")
    found = {}
    for p in sorted(tmp_path.rglob("*")):
        if any(p.is_relative_to(c) for c in caches):
            continue
        if p.is_symlink():
            found[str(p)] = b"symlink -> " + str(p.readlink()).encode()
        elif p.is_file():
            found[str(p)] = p.read_bytes()
    return found


def fetch_target(**options) -> list:
    """The app's path: ``fetch_events`` (what app/picker/downloads.py runs on its worker)."""
    return list(fetch_events(TARGET, threading.Event(), drafter=False, **options))


def assert_refused(events, kind: str, *words: str) -> DownloadFailed:
    last = events[-1]
    assert isinstance(last, DownloadFailed), last
    assert last.kind == kind, last
    for word in words:
        assert word in last.error, last.error
    assert is_installed(TARGET) is None
    return last


# --- names from the network that would become paths -------------------------------------------

@pytest.mark.parametrize("sha", [
    "../../../../somewhere",            # lands in tmp_path/somewhere
    "ABSOLUTE",                         # replaced below by an absolute path in tmp_path
    "0123456789ABCDEF0123456789ABCDEF01234567",  # hex, but not the Hub's lowercase form
    "0123456789abcdef",                 # too short
    None,                               # no commit id at all (was: the revision used as a folder name)
], ids=["dotdot", "absolute", "uppercase", "short", "missing"])
def test_a_commit_id_that_is_not_a_commit_is_refused(fake_hub, tmp_path, sha):
    if sha == "ABSOLUTE":
        sha = str(tmp_path / "somewhere")
    plant_victims(tmp_path, "somewhere/config.json", "somewhere/model.safetensors")
    before = tree_outside_cache(tmp_path)
    fake_hub.serve_commit_as(TARGET, sha)

    failed = assert_refused(fetch_target(), "unsafe", TARGET, "commit")

    assert outside_cache_unchanged(tmp_path, before)
    assert not [e for e in fake_hub.requests() if e.kind in ("resolve", "cdn")]  # refused before any file
    assert "Traceback" not in failed.error


@pytest.mark.parametrize("name", [
    "../../../../evil.safetensors",
    "/tmp/evil.safetensors",
    "sub/../../../evil.json",
    "..\\..\\evil.gguf",
    "\\evil.safetensors",               # chosen as weights (no dot before .safetensors) today
    "C:evil.safetensors",
    "evil\0.json",
    "./config.json",
    "a//config.json",
], ids=["dotdot", "absolute", "inner-dotdot", "backslash-dotdot", "backslash", "drive", "nul", "dot", "empty-part"])
def test_a_listed_file_name_that_is_a_path_is_refused(fake_hub, model_dirs, tmp_path, name):
    fake_hub.add_repo(TARGET, model_dirs["target"], extra={name: b"evil" * 100})
    before = tree_outside_cache(tmp_path)

    failed = assert_refused(fetch_target(), "unsafe", TARGET, "file name")

    assert repr(name)[1:-1] in failed.error or name in failed.error
    assert outside_cache_unchanged(tmp_path, before)
    assert not [e for e in fake_hub.requests() if e.kind in ("resolve", "cdn")]


@pytest.mark.parametrize("path,etag", [
    (WEIGHTS, "../../../../victim"),    # an LFS file's X-Linked-Etag
    (WEIGHTS, "/ABSOLUTE/victim"),
    (WEIGHTS, "d41d8cd98f00b204e9800998ecf8427e"),  # an md5: a hash, but not one that names a Hub blob
    ("config.json", "../../../../victim"),          # a regular file's ETag
], ids=["lfs-dotdot", "lfs-absolute", "md5", "regular-dotdot"])
def test_an_etag_that_is_not_a_hash_is_refused(fake_hub, tmp_path, path, etag):
    etag = etag.replace("/ABSOLUTE", str(tmp_path))
    plant_victims(tmp_path, "victim", "victim.incomplete")
    before = tree_outside_cache(tmp_path)
    fake_hub.send_etag_as(TARGET, path, etag)

    assert_refused(fetch_target(), "unsafe", f"{TARGET}/{path}", "ETag")

    assert outside_cache_unchanged(tmp_path, before)
    assert not fake_hub.gets(TARGET, path)  # refused at the HEAD request, before its body


@pytest.mark.parametrize("path", [WEIGHTS, "config.json"], ids=["lfs-sha256", "git-blob-id"])
def test_a_listed_hash_that_is_a_path_is_refused(fake_hub, tmp_path, path):
    """A listing hash names the blob to reuse: one that is a path made the client hash an
    outside file, find it "corrupt" and delete it."""
    plant_victims(tmp_path, "victim")
    before = tree_outside_cache(tmp_path)
    fake_hub.list_hash_as(TARGET, path, "../../../../victim")

    assert_refused(fetch_target(), "unsafe", TARGET, path)

    assert outside_cache_unchanged(tmp_path, before)
    assert not [e for e in fake_hub.requests() if e.kind in ("resolve", "cdn")]


# --- the revision asked for -----------------------------------------------------------------------

BAD_REVISIONS = ["../../../../x", "/x", "refs/../../../../x", "a/./b", "main/", "x..y", ".hidden",
                 "a\\b", "a b", "x.lock", "a:b", "@", "a@{1}", "ref\0", ""]


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_a_revision_that_is_not_a_branch_tag_or_commit_is_refused_before_any_request(fake_hub, tmp_path, revision):
    fake_hub.any_revision = True  # a lax server would answer it
    plant_victims(tmp_path, "x")
    before = tree_outside_cache(tmp_path)

    with pytest.raises(HubError) as err:
        plan_download(TARGET, drafter=False, revision=revision)
    failed = fetch_target(revision=revision)[-1]

    assert err.value.kind == failed.kind == "unsafe"
    assert "revision" in str(err.value) and TARGET in str(err.value) and repr(revision) in str(err.value)
    assert outside_cache_unchanged(tmp_path, before)
    assert not fake_hub.requests()


@pytest.mark.parametrize("revision", ["v1.0", "refs/pr/1", "feature/new-tokenizer", "COMMIT"])
def test_branch_tag_pr_and_commit_revisions_are_accepted(fake_hub, revision):
    fake_hub.any_revision = True
    commit = fake_hub.repos[TARGET].commit
    revision = revision.replace("COMMIT", commit)
    done = download(TARGET, drafter=False, revision=revision)

    assert (done.target_path / WEIGHTS).read_bytes() == fake_hub.file(TARGET, WEIGHTS).data
    ref = hub_cache_dir() / "models--org--tiny" / "refs" / revision
    if revision == commit:
        assert not ref.exists()  # a commit needs no ref, as in huggingface_hub
    else:
        assert ref.read_text() == commit
    assert is_installed(TARGET, revision=revision) == done.target_path


def test_a_commit_asked_for_must_be_the_commit_answered(fake_hub):
    fake_hub.any_revision = True  # answers every revision with its one commit
    asked = "0123456789abcdef0123456789abcdef01234567"

    failed = fetch_target(revision=asked)[-1]

    assert isinstance(failed, DownloadFailed) and failed.kind == "unsafe"
    assert asked in failed.error and fake_hub.repos[TARGET].commit in failed.error
    assert not (hub_cache_dir() / "models--org--tiny" / "refs" / asked).exists()


def test_cli_refuses_a_revision_that_is_a_path_without_a_traceback(fake_hub, tmp_path):
    fake_hub.any_revision = True
    plant_victims(tmp_path, "x")
    before = tree_outside_cache(tmp_path)

    proc = cli(TARGET, "--no-drafter", "--revision", "../../../../x")
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 1, err
    assert "Traceback" not in err and "revision" in err and "'../../../../x'" in err and TARGET in err
    assert outside_cache_unchanged(tmp_path, before)
    assert not fake_hub.requests()


# --- bodies longer than declared ----------------------------------------------------------------

def partial_of(fake_hub, path=WEIGHTS):
    sha = fake_hub.file(TARGET, path).sha256
    return hub_cache_dir() / "models--org--tiny" / "blobs" / f"{sha}.incomplete"


def test_an_endless_body_stops_at_the_declared_size_and_is_deleted(fake_hub):
    size = len(fake_hub.file(TARGET, WEIGHTS).data)
    fake_hub.send_endless(TARGET, WEIGHTS)

    failed = assert_refused(fetch_target(), "corrupt", f"{TARGET}/{WEIGHTS}", "longer than")
    fake_hub.wait_idle()

    sent = weights_gets(fake_hub)[-1].bytes_sent
    assert sent < size + (16 << 20) < fake_hub.endless_cap  # the client hung up; it did not read to the cap
    assert f"{size:,}" in failed.error
    assert not partial_of(fake_hub).exists()

    fake_hub.endless.clear()  # a sane server again: the next run fetches the file afresh
    assert isinstance(fetch_target()[-1], DownloadFinished) and is_installed(TARGET)


def test_a_body_whose_content_length_exceeds_the_file_is_refused_before_it_is_written(fake_hub):
    size = len(fake_hub.file(TARGET, WEIGHTS).data)
    fake_hub.send_overlong(TARGET, WEIGHTS, extra=5 << 20, declared=True)
    watched = partial_of(fake_hub)
    largest = [0]
    stop = threading.Event()

    def watch() -> None:  # the partial file must never grow past the file's size
        while not stop.is_set():
            try:
                largest[0] = max(largest[0], watched.stat().st_size)
            except FileNotFoundError:
                pass
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        failed = assert_refused(fetch_target(), "corrupt", f"{TARGET}/{WEIGHTS}", "Content-Length")
    finally:
        stop.set()
        watcher.join()
    assert str(size + (5 << 20)) in failed.error.replace(",", "") and largest[0] <= size
    assert not watched.exists()


def test_surplus_bytes_past_the_content_length_are_never_read(fake_hub):
    fake_hub.send_overlong(TARGET, WEIGHTS, extra=1 << 20, declared=False)

    done = fetch_target()[-1]

    assert isinstance(done, DownloadFinished)
    data = (done.target_path / WEIGHTS).read_bytes()
    assert hashlib.sha256(data).hexdigest() == fake_hub.file(TARGET, WEIGHTS).sha256


def test_an_endless_listing_is_refused_without_reading_it_all(fake_hub, monkeypatch):
    from engine.hub import listing

    monkeypatch.setattr(listing, "MAX_LISTING_BYTES", 1 << 20)
    fake_hub.endless_listing = True

    with pytest.raises(HubError) as err:
        plan_download(TARGET, drafter=False)

    assert err.value.kind == "unsafe" and TARGET in str(err.value) and "listing" in str(err.value)
    fake_hub.wait_idle()
    sent = max(e.bytes_sent for e in fake_hub.requests() if e.kind == "api")
    assert sent < 16 << 20 < fake_hub.endless_cap  # the client hung up soon after its bound


# --- a server that stops sending ------------------------------------------------------------------

def test_a_stall_times_out_and_the_same_download_resumes(fake_hub, monkeypatch):
    monkeypatch.setattr(transfer, "READ_TIMEOUT_S", 0.5)
    size = len(fake_hub.file(TARGET, WEIGHTS).data)
    fake_hub.stall_file(TARGET, WEIGHTS, after_bytes=300_000)

    start = time.monotonic()
    done = download(TARGET, drafter=False)

    assert time.monotonic() - start < 10
    assert is_installed(TARGET) == done.target_path
    fake_hub.release_stalls()  # the stalled body's handler ends and logs what it sent
    fake_hub.wait_idle()
    first, second = sorted(weights_gets(fake_hub), key=lambda e: e.range or "")
    assert (first.status, first.bytes_sent) == (200, 300_000)
    assert (second.status, second.range, second.bytes_sent) == (206, "bytes=300000-", size - 300_000)


def test_a_server_that_stays_silent_fails_clearly_and_a_rerun_resumes(fake_hub, monkeypatch):
    monkeypatch.setattr(transfer, "READ_TIMEOUT_S", 0.5)
    monkeypatch.setattr(transfer, "RETRIES", 1)
    size = len(fake_hub.file(TARGET, WEIGHTS).data)
    fake_hub.stall_file(TARGET, WEIGHTS, after_bytes=300_000, times=100)

    failed = assert_refused(fetch_target(), "network", f"{TARGET}/{WEIGHTS}", "stopped sending", "resume")

    assert "Traceback" not in failed.error
    assert partial_of(fake_hub).stat().st_size == 300_000  # kept for the resume
    fake_hub.release_stalls()
    fake_hub.wait_idle()
    done = fetch_target()[-1]
    assert isinstance(done, DownloadFinished)
    last = weights_gets(fake_hub)[-1]
    assert (last.status, last.range, last.bytes_sent) == (206, "bytes=300000-", size - 300_000)
