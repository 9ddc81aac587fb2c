"""The checks on names that become paths (engine.hub.safe_names) and the cache's last fence."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from engine.hub import cache
from engine.hub.files import files_from_listing
from engine.hub.safe_names import (
    UnsafeName,
    blob_hash,
    commit_id,
    repo_file_path,
    revision,
    within,
)

SHA1 = "0123456789abcdef0123456789abcdef01234567"
SHA256 = "a" * 64


@pytest.mark.parametrize("good", ["config.json", "mtp/config.json", "a/b/c.safetensors", "model-00001-of-00002.safetensors",
                                  ".gitattributes", "dir.with.dots/x..y.bin", "ünïcode.json"])
def test_relative_repo_paths_are_accepted(good):
    assert repo_file_path(good, "org/m") == good


@pytest.mark.parametrize("bad", ["", "..", "../x", "a/../../x", "a/..", "/etc/passwd", "C:x.bin", "c:\\x", "a\\b",
                                 "a\0b", "a\nb", "./a", "a/./b", "a//b", "a/", 7, None, "x" * 1001])
def test_unsafe_repo_paths_are_refused_naming_the_repo(bad):
    with pytest.raises(UnsafeName) as err:
        repo_file_path(bad, "org/m")
    assert "org/m" in str(err.value) and "file name" in str(err.value)


def test_commit_ids_are_40_lowercase_hex():
    assert commit_id(SHA1, "org/m") == SHA1
    for bad in (SHA1.upper(), SHA1[:-1], SHA1 + "0", "main", "../" + SHA1, "", None, 12):
        with pytest.raises(UnsafeName, match="org/m.*not a commit"):
            commit_id(bad, "org/m")


def test_blob_names_are_sha256_or_git_sha1():
    assert blob_hash(SHA1, "org/m") == SHA1 and blob_hash(SHA256, "org/m") == SHA256
    for bad in ("d41d8cd98f00b204e9800998ecf8427e", SHA256.upper(), "../" + SHA256, SHA256 + ".lock", "", None):
        with pytest.raises(UnsafeName, match="org/m/f.bin.*ETag"):
            blob_hash(bad, "org/m", "f.bin")


@pytest.mark.parametrize("good", ["main", "v1.0", "refs/pr/1", "feature/new-tokenizer", "release-2024.06", SHA1, "a@b"])
def test_branch_tag_pr_and_commit_revisions_are_valid(good):
    assert revision(good, "org/m") == good


@pytest.mark.parametrize("bad", ["", "..", "../x", "a/../b", "/main", "main/", "a//b", "x..y", ".hidden", "a/.b",
                                 "x.lock", "a/x.lock/b", "end.", "a b", "a\tb", "a~1", "a^", "a:b", "a?", "a*", "a[",
                                 "a\\b", "@", "a@{1}", "nul\0", "x" * 256, None])
def test_revisions_git_would_refuse_are_refused(bad):
    with pytest.raises(UnsafeName) as err:
        revision(bad, "org/m")
    assert "org/m" in str(err.value) and "not a valid revision" in str(err.value) and repr(bad)[:20] in str(err.value)


def test_within_follows_symlinks(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "inner").mkdir(parents=True)
    outside.mkdir()
    assert within(root, root / "inner" / "x") == root / "inner" / "x"
    assert within(root, root) == root
    with pytest.raises(UnsafeName, match="outside"):
        within(root, root / ".." / "outside" / "x")
    (root / "escape").symlink_to(outside, target_is_directory=True)  # a link planted in the cache
    with pytest.raises(UnsafeName, match="outside"):
        within(root, root / "escape" / "x")


def test_cache_paths_refuse_unsafe_names_and_escaping_links(tmp_path):
    """Every path the cache builds goes through the checks, whatever the caller validated."""
    hub = tmp_path / "hub"
    with pytest.raises(UnsafeName):
        cache.snapshot_dir(hub, "org/m", "../../../x")
    with pytest.raises(UnsafeName):
        cache.pointer_path(hub, "org/m", SHA1, "../../../../x")
    with pytest.raises(UnsafeName):
        cache.blob_path(hub, "org/m", "../../x")
    with pytest.raises(UnsafeName):
        cache.partial_path(hub, "org/m", "/abs")
    with pytest.raises(UnsafeName):
        cache.lock_path(hub, "org/m", "../x")
    with pytest.raises(UnsafeName):
        cache.write_ref(hub, "org/m", "../../../../x", SHA1)
    with pytest.raises(UnsafeName):
        cache.write_ref(hub, "org/m", "main", "../x")
    assert not (tmp_path / "x").exists()

    # A snapshots folder that is a link out of the cache (planted, or left by a hostile run).
    storage = hub / "models--org--m"
    storage.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (storage / "snapshots").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafeName, match="outside"):
        cache.pointer_path(hub, "org/m", SHA1, "config.json")

    cache.write_ref(hub, "org/m", "refs/pr/1", SHA1)
    assert (storage / "refs" / "refs" / "pr" / "1").read_text() == SHA1


def test_a_marker_naming_an_unsafe_commit_is_ignored_not_followed(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    marker = cache._marker_path("org/m", None, "main")
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"version": cache.MARKER_VERSION, "repo": "org/m", "revision": "main",
                                  "commit": "../../../..", "subfolder": None, "precision": None,
                                  "cache": str(tmp_path / "hub"), "files": [{"path": "x", "size": 1, "mtime_ns": 1}]}))
    assert cache.read_installed("org/m") is None


def sibling(name, size=10, blob_id=SHA1, lfs=None):
    return SimpleNamespace(rfilename=name, size=size, blob_id=blob_id, lfs=lfs)


def test_a_listing_is_checked_as_it_is_read():
    lfs = SimpleNamespace(sha256=SHA256, size=100)
    files = files_from_listing([sibling("config.json"), sibling("model.safetensors", lfs=lfs), sibling("a.txt", None, None)], "org/m")
    assert [(f.path, f.size, f.etag) for f in files] == [("config.json", 10, SHA1), ("model.safetensors", 100, SHA256),
                                                         ("a.txt", -1, None)]
    for bad in ([sibling("../x")], [sibling("x", blob_id="../y")], [sibling("x", blob_id=SHA256)],  # a blob id is a sha1
                [sibling("x", lfs=SimpleNamespace(sha256=SHA1, size=1))],                        # an LFS oid is a sha256
                [sibling("x", size=-5)], [sibling("x", size="10")]):
        with pytest.raises(UnsafeName, match="org/m"):
            files_from_listing(bad, "org/m")


def test_hf_home_behind_a_symlink_still_works(tmp_path):
    """A cache folder that is itself a link (a bigger disk mounted elsewhere) is its own root."""
    real = tmp_path / "big-disk" / "hub"
    real.mkdir(parents=True)
    os.symlink(real, tmp_path / "hub")
    path = cache.pointer_path(tmp_path / "hub", "org/m", SHA1, "config.json")
    assert path == tmp_path / "hub" / "models--org--m" / "snapshots" / SHA1 / "config.json"
