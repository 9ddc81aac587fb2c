"""Where Hub downloads live on disk, and which ones Tandem has verified.

Files go into huggingface_hub's own cache, in its layout (``models--org--name/blobs/<etag>``,
``snapshots/<commit>/<path>`` symlinks, ``refs/<revision>``), so a model fetched by other tools
is reused and ours are visible to them. The cache location follows huggingface_hub's variables
(HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME), read at call time rather than at import so that a test
or a settings change takes effect without reloading huggingface_hub.

"Installed" is Tandem's own notion, kept outside the Hub cache (in Tandem's cache dir, so that
huggingface_hub's cache scanner never meets foreign files): a marker written only after every
file of a model was checked against the size and hash the Hub published. The marker records
each file's size and mtime, so a later check is a few ``stat`` calls, and a file replaced or
truncated since then makes the model not installed again.

Every path is built here, from names checked first (``engine.hub.safe_names``: a commit id, a
blob hash, a relative repo path, a revision) and then resolved and refused if it leads outside
its root: what the Hub answers never names a file outside the cache.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from engine.core.paths import cache_dir as tandem_cache_dir
from engine.hub.files import HubFile
from engine.hub.safe_names import (
    UnsafeName,
    blob_hash,
    commit_id,
    repo_file_path,
    within,
)
from engine.hub.safe_names import revision as checked_revision

log = logging.getLogger(__name__)
MARKER_VERSION = 1
ANY_PRECISION = "*"


def hub_cache_dir() -> Path:
    """huggingface_hub's cache folder, resolved from the environment as huggingface_hub does."""
    env = os.environ
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(os.path.expandvars(os.path.expanduser(env[key])))
    if env.get("HF_HOME"):
        return Path(os.path.expandvars(os.path.expanduser(env["HF_HOME"]))) / "hub"
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def repo_folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def storage_dir(cache: Path, repo: str) -> Path:
    return within(cache, cache / repo_folder(repo))


def blob_path(cache: Path, repo: str, etag: str) -> Path:
    return within(cache, storage_dir(cache, repo) / "blobs" / blob_hash(etag, repo))


def partial_path(cache: Path, repo: str, etag: str) -> Path:
    # The name huggingface_hub < 1.x also used for its resumable partial downloads.
    return within(cache, blob_path(cache, repo, etag).with_name(f"{etag}.incomplete"))


def lock_path(cache: Path, repo: str, etag: str) -> Path:
    # Same lock file as huggingface_hub's, so it and Tandem never write one blob at once.
    return within(cache, cache / ".locks" / repo_folder(repo) / f"{blob_hash(etag, repo)}.lock")


def snapshot_dir(cache: Path, repo: str, commit: str, subfolder: str | None = None) -> Path:
    path = storage_dir(cache, repo) / "snapshots" / commit_id(commit, repo)
    return within(cache, path / repo_file_path(subfolder, repo) if subfolder else path)


def pointer_path(cache: Path, repo: str, commit: str, file_path: str) -> Path:
    path = snapshot_dir(cache, repo, commit).joinpath(*repo_file_path(file_path, repo).split("/"))
    return within(cache, path)


def write_ref(cache: Path, repo: str, revision: str, commit: str) -> None:
    commit_id(commit, repo)
    if revision == commit:
        return
    ref = within(cache, storage_dir(cache, repo) / "refs" / checked_revision(revision, repo))
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(ref.name + ".tandem-tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def link_pointer(blob: Path, pointer: Path) -> None:
    """Point ``pointer`` at ``blob`` with a relative symlink (what huggingface_hub does), or a
    copy where symlinks are not allowed (Windows without developer mode)."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:
        shutil.copyfile(blob, pointer)


# --- installed markers -----------------------------------------------------------------------

@dataclass(frozen=True)
class InstalledModel:
    """A verified download. ``path`` is what a load takes: the model folder, or for a
    single-file model (a GGUF variant) its ``entry_file`` (the first part of a split one)."""

    repo: str
    revision: str
    commit: str
    subfolder: str | None
    path: Path
    files: tuple[HubFile, ...]
    precision: str | None = None
    entry_file: str | None = None


def _marker_root() -> Path:
    return tandem_cache_dir() / "hub" / "installed"


def _marker_stem(repo: str, subfolder: str | None) -> str:
    return repo_folder(repo) + (f"--{subfolder}" if subfolder else "")


def _marker_path(repo: str, subfolder: str | None, revision: str, precision: str | None = None) -> Path:
    # One marker per weight variant: a repo's Q4_K_M and Q8_0 files (or its fp16 and default
    # safetensors) are installed side by side, and fetching one never unregisters the other.
    variant = f"~{quote(precision, safe='')}" if precision else ""
    name = _marker_stem(repo, subfolder) + variant + "@" + quote(revision, safe="")
    root = _marker_root()
    return within(root, root / f"{name}.json")


def _marker_paths(repo: str, subfolder: str | None, revision: str, precision: str | None) -> list[Path]:
    """The markers that may hold ``precision`` (ANY_PRECISION: the default weights' first, then
    every variant's, in name order)."""
    if precision != ANY_PRECISION:
        return [_marker_path(repo, subfolder, revision, precision)]
    default = _marker_path(repo, subfolder, revision)
    pattern = f"{_marker_stem(repo, subfolder)}~*@{quote(revision, safe='')}.json"
    return [default, *sorted(_marker_root().glob(pattern))]


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()  # follows the snapshot symlink to the blob
    return st.st_size, st.st_mtime_ns


def write_marker(cache: Path, repo: str, revision: str, commit: str, subfolder: str | None,
                 files: tuple[HubFile, ...], precision: str | None = None, entry_file: str | None = None) -> None:
    """Record a verified model. Call only after every file was checked. ``entry_file`` (a path
    in the repo) names the file a load opens, for a single-file model such as a GGUF variant."""
    entries = []
    for f in files:
        size, mtime = _stamp(pointer_path(cache, repo, commit, f.path))
        entries.append({"path": f.path, "size": size, "mtime_ns": mtime, "sha256": f.sha256, "git_sha1": f.git_sha1})
    if entry_file is not None and entry_file not in {f.path for f in files}:
        raise ValueError(f"{repo}: the entry file {entry_file} is not one of the model's files")
    marker = _marker_path(repo, subfolder, revision, precision)
    marker.parent.mkdir(parents=True, exist_ok=True)
    data = {"version": MARKER_VERSION, "repo": repo, "revision": revision, "commit": commit,
            "subfolder": subfolder, "precision": precision, "cache": str(cache), "files": entries,
            "entry_file": entry_file}
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, marker)


def forget(repo: str, subfolder: str | None = None, revision: str = "main", precision: str | None = None) -> None:
    _marker_path(repo, subfolder, revision, precision).unlink(missing_ok=True)


def read_installed(repo: str, subfolder: str | None = None, revision: str = "main",
                   precision: str | None = ANY_PRECISION) -> InstalledModel | None:
    """The verified model for (repo, subfolder, revision) in the current Hub cache, or None if
    it was never verified or any of its files is missing or changed since. ``precision``
    (a weight variant, None for the default weights) must match unless left at ANY_PRECISION."""
    for marker in _marker_paths(repo, subfolder, revision, precision):
        try:
            found = _read_marker(marker, repo, subfolder, precision)
        except UnsafeName as exc:  # a marker edited by hand, or written before names were checked
            log.warning("%s: ignoring its installed marker: %s", repo, exc)
            found = None
        if found is not None:
            return found
    return None


def _read_marker(marker: Path, repo: str, subfolder: str | None, precision: str | None) -> InstalledModel | None:
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    cache = hub_cache_dir()
    if data.get("version") != MARKER_VERSION or Path(data["cache"]) != cache:
        return None
    if precision != ANY_PRECISION and data.get("precision") != precision:
        return None
    commit = data["commit"]
    files = []
    for entry in data["files"]:
        try:
            stamp = _stamp(pointer_path(cache, repo, commit, entry["path"]))
        except OSError:
            return None
        if stamp != (entry["size"], entry["mtime_ns"]):
            log.info("%s: %s changed since it was verified", repo, entry["path"])
            return None
        files.append(HubFile(entry["path"], entry["size"], entry["sha256"], entry["git_sha1"]))
    entry_file = data.get("entry_file")
    if entry_file is not None and entry_file not in {f.path for f in files}:
        return None
    path = pointer_path(cache, repo, commit, entry_file) if entry_file else snapshot_dir(cache, repo, commit, subfolder)
    return InstalledModel(repo, data["revision"], commit, subfolder, path, tuple(files), data.get("precision"), entry_file)


def is_installed(repo: str, revision: str = "main", subfolder: str | None = None,
                 precision: str | None = ANY_PRECISION) -> Path | None:
    """What a load takes (the folder, or a GGUF variant's file) of a complete, verified download
    of ``repo`` (local check only), else None. ``precision``: a weight variant (e.g. "Q4_K_M"),
    None for the default weights; left out, any (the default weights first)."""
    found = read_installed(repo, subfolder, revision, precision)
    return found.path if found else None


# --- verified blobs --------------------------------------------------------------------------

def _verified_path(repo: str, etag: str) -> Path:
    root = tandem_cache_dir() / "hub" / "verified"
    return within(root, root / repo_folder(repo) / blob_hash(etag, repo))


def _blob_stamp(blob: Path) -> str:
    st = blob.stat()
    return f"{blob.resolve()} {st.st_size} {st.st_mtime_ns}"


def mark_blob_verified(cache: Path, repo: str, etag: str) -> None:
    """Remember that a blob matched its hash, so a resumed multi-file download does not hash
    gigabytes again; the stamp (path, size, mtime) no longer matches once the file changes."""
    path = _verified_path(repo, etag)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_blob_stamp(blob_path(cache, repo, etag)))


def blob_verified(cache: Path, repo: str, etag: str) -> bool:
    try:
        return _verified_path(repo, etag).read_text() == _blob_stamp(blob_path(cache, repo, etag))
    except OSError:
        return False


# --- remembered pairings ---------------------------------------------------------------------

def _pair_path(target_repo: str) -> Path:
    root = tandem_cache_dir() / "hub" / "pairs"
    return within(root, root / f"{repo_folder(target_repo)}.json")


def remember_pair(target_repo: str, drafter_repo: str, subfolder: str | None, kind: str) -> None:
    """Which drafter was fetched for a target, so an offline start finds it without the Hub."""
    path = _pair_path(target_repo)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"drafter_repo": drafter_repo, "subfolder": subfolder, "kind": kind}))


def remembered_pair(target_repo: str) -> tuple[str, str | None, str] | None:
    try:
        data = json.loads(_pair_path(target_repo).read_text())
        return data["drafter_repo"], data["subfolder"], data["kind"]
    except (OSError, ValueError, KeyError):
        return None
