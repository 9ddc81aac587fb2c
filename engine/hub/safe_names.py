"""Names that come from the network (or the command line) and become paths, checked first.

A download turns the Hub's answers into paths in huggingface_hub's cache: the commit id a
listing reports names ``snapshots/<commit>``, each file's path in the repo names
``snapshots/<commit>/<path>``, the hash that identifies a file names ``blobs/<hash>``, and the
revision asked for names ``refs/<revision>``. A hostile or broken server (a mirror, a proxy,
anything in between) could answer ``../../..`` or an absolute path and make the download
replace or delete files anywhere the user can write. So there are two fences:

* every such value must have the form the Hub itself uses (a commit is 40 lowercase hex digits,
  a blob is named by a sha256 or a git blob id, a file path is relative with no ``..``, a
  revision follows git's rules for branch and tag names), checked where it enters;
* every path built from them is resolved (symlinks too) and must stay inside its root
  (``within``), in the one place each kind of path is built (``engine.hub.cache``).
"""
from __future__ import annotations

import re
from pathlib import Path

COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
GIT_SHA1 = COMMIT  # a git blob id has the same form as a commit id
MAX_NAME = 1000    # longer than any real repo path, short enough for every filesystem's limits
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")
# git check-ref-format: characters a branch or tag name may not contain.
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


class UnsafeName(ValueError):
    """A name that must not become a path: not of the form the Hub uses, or one that would
    lead outside the cache. Its message names the repo and the value."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def commit_id(value: object, repo: str) -> str:
    """``value`` if it is a commit id (40 lowercase hex digits), else ``UnsafeName``."""
    if isinstance(value, str) and COMMIT.fullmatch(value):
        return value
    raise UnsafeName(
        f"{repo}: the Hub answered {_shown(value)} as the commit id, which is not a commit"
        " (40 lowercase hex digits); refusing to use it as a folder name.")


def blob_hash(value: object, repo: str, path: str | None = None, what: str = "ETag",
              pattern: re.Pattern[str] | None = None) -> str:
    """``value`` if it is a sha256 (LFS files) or a git blob id (regular files) in hex --
    the only names a blob has in huggingface_hub's cache; ``pattern`` narrows it to one form."""
    ok = isinstance(value, str) and (pattern.fullmatch(value) if pattern else SHA256.fullmatch(value) or GIT_SHA1.fullmatch(value))
    if ok:
        return value
    where = f"{repo}/{path}" if path else repo
    raise UnsafeName(
        f"{where}: the Hub sent {_shown(value)} as its {what}, which is not a file hash (a hex sha256"
        " or git blob id); refusing to use it as a file name.")


def _path_problem(value: str) -> str | None:
    if not value:
        return "it is empty"
    if len(value) > MAX_NAME:
        return f"it is longer than {MAX_NAME} characters"
    if _CONTROL.search(value):
        return "it contains a control character (NUL, newline...)"
    if "\\" in value:
        return "it contains a backslash"
    if value.startswith("/") or _DRIVE.match(value):
        return "it is an absolute path"
    parts = value.split("/")
    if any(p == "" for p in parts):
        return "it has an empty path component (a leading, trailing or doubled /)"
    if any(p in (".", "..") for p in parts):
        return "it has a . or .. component"
    return None


def repo_file_path(value: object, repo: str) -> str:
    """``value`` if it is a safe relative file path inside a repo (what git allows, less
    what would mean something else on Windows), else ``UnsafeName``."""
    problem = "it is not a string" if not isinstance(value, str) else _path_problem(value)
    if problem is None:
        return value
    raise UnsafeName(f"{repo}: the Hub listed the file name {_shown(value)}, which is not a safe path ({problem});"
                     " refusing to download from this listing.")


def _revision_problem(value: str) -> str | None:
    if not value:
        return "it is empty"
    if len(value) > 255:
        return "it is longer than 255 characters"
    if _REF_FORBIDDEN.search(value):
        return "it contains a space, a control character or one of ~ ^ : ? * [ \\"
    if value.startswith("/") or value.endswith("/") or "//" in value:
        return "it starts or ends with / or has an empty component"
    if ".." in value:
        return "it contains .."
    if value == "@" or "@{" in value:
        return "it is @ or contains @{"
    if value.endswith("."):
        return "it ends with ."
    if any(p.startswith(".") or p.endswith(".lock") for p in value.split("/")):
        return "a component starts with . or ends with .lock"
    return None


def revision(value: object, repo: str) -> str:
    """``value`` if it is a commit id or a name git allows for a branch or tag (``main``,
    ``v1.0``, ``refs/pr/1``), else ``UnsafeName``; it names ``refs/<revision>`` in the cache."""
    if isinstance(value, str) and COMMIT.fullmatch(value):
        return value
    problem = "it is not a string" if not isinstance(value, str) else _revision_problem(value)
    if problem is None:
        return value
    raise UnsafeName(f"{repo}: {_shown(value)} is not a valid revision ({problem}). Use a branch or tag name"
                     " (e.g. main, v1.0, refs/pr/1) or a 40-character commit id.")


def within(root: Path, path: Path) -> Path:
    """``path`` itself if, with symlinks resolved, it lies inside ``root``; else ``UnsafeName``.
    The last fence: whatever was checked before, no path the download builds leaves its root."""
    real_root = Path(root).resolve()
    real = Path(path).resolve()
    if real == real_root or real.is_relative_to(real_root):
        return path
    raise UnsafeName(f"refusing to touch {path}: it resolves to {real}, outside {real_root}.")
