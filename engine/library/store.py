"""JSON files replaced whole, never edited in place.

Each write goes to a temporary file in the same folder, is flushed to disk, then renamed over
the old one (``os.replace`` is atomic on POSIX and Windows): a reader, or the next start after
a crash or a kill mid-write, sees either the old file or the new one, never half of either.
A killed writer's temporary (its pid is in the name) is removed by a later write once it is
surely abandoned (engine.core.scratch_files).

A file that several processes change (the registry: two ``tandem import`` at once) is changed
under ``locked(path)``: read, changed and written back while holding a lock file beside it, so
no writer's change is lost to another's. Files are read with bounds (engine.core.bounded_json):
anyone can replace them, with a FIFO, a link to /dev/zero or brackets nested 100,000 deep.
"""
from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.core import bounded_json, scratch_files

log = logging.getLogger(__name__)

#: How long a writer waits for another to finish (a registry write takes milliseconds).
LOCK_TIMEOUT_S = 30.0


def _temporaries(path: Path) -> re.Pattern:
    return re.compile(rf"\.{re.escape(path.name)}\.(?P<pid>\d+)\.\w+\.tmp")


def write_json_atomic(path: Path, value) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch_files.remove_stale(path.parent, _temporaries(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path, max_bytes: int = bounded_json.MAX_BYTES):
    """The file's value, or None where it is missing or unreadable (not a regular file, over
    ``max_bytes``, nested too deep, not JSON: logged, as the caller starts afresh)."""
    try:
        return bounded_json.load(path, max_bytes)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s (%s)", path, exc)
        return None


def lock_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".lock")


@contextmanager
def locked(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the lock of ``path`` (``<path>.lock``, an OS file lock: released when the holder
    exits, however it exits). Raises ``TimeoutError`` (an OSError) after ``timeout`` seconds."""
    from filelock import FileLock, Timeout

    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(lock), timeout=timeout):
            yield
    except Timeout:
        raise TimeoutError(f"{path} is being changed by another Tandem process (waited {timeout:.0f} s for {lock.name})") \
            from None
