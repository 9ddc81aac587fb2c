"""Temporary files Tandem writes before renaming them into place, and the disk checks that
count them.

Every large file Tandem writes (an int8 / int4 weight cache, a converted model, an assembled
GGUF) is written under a temporary name and renamed when complete, so a crash never leaves a
file that looks finished. A process killed mid-write (kill -9, power loss, OOM killer) leaves
the temporary behind instead: up to 3.5 GB for the default target. Those are ours to remove,
but only when they are surely abandoned: the name must be one of our patterns AND nothing may
have touched the file for a while (a live writer keeps its mtime fresh), so a second Tandem
process writing the same cache right now keeps its file.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: A temporary untouched this long is abandoned, whatever wrote it (writing a 3.5 GB model takes
#: well under a minute; nothing keeps one of ours open and idle).
STALE_AFTER_S = 600.0
#: A temporary whose writer's pid (in its name) is not running is abandoned sooner.
DEAD_WRITER_AFTER_S = 30.0



@dataclass(frozen=True)
class Scratch:
    """One temporary of ours: a file or a folder, its size and when it was last written."""

    path: Path
    bytes: int
    age_s: float
    writer_pid: int | None

    @property
    def stale(self) -> bool:
        if self.age_s >= STALE_AFTER_S:
            return True
        return self.writer_pid is not None and self.age_s >= DEAD_WRITER_AFTER_S and not _running(self.writer_pid)


class NotEnoughDisk(OSError):
    pass


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _size_and_mtime(path: Path) -> tuple[int, float]:
    """A folder counts every file under it and its newest mtime (a writer adds files to it)."""
    stat = path.stat()
    if not path.is_dir():
        return stat.st_size, stat.st_mtime
    size, newest = 0, stat.st_mtime
    for child in path.rglob("*"):
        try:
            s = child.stat()
        except OSError:
            continue
        newest = max(newest, s.st_mtime)
        if child.is_file():
            size += s.st_size
    return size, newest


def find(directory: Path, name: re.Pattern) -> list[Scratch]:
    """Our temporaries in ``directory``: the entries whose whole name matches ``name``. A group
    named "pid" in ``name`` holds the writer's process id."""
    found = []
    now = time.time()
    directory = Path(directory)
    if not directory.is_dir():
        return found
    for path in directory.iterdir():
        if not name.fullmatch(path.name):
            continue
        try:
            size, mtime = _size_and_mtime(path)
        except OSError:  # removed meanwhile
            continue
        pid = name.fullmatch(path.name).groupdict().get("pid")
        found.append(Scratch(path, size, max(0.0, now - mtime), int(pid) if pid else None))
    return found


def remove_stale(directory: Path, name: re.Pattern) -> int:
    """Remove the abandoned temporaries among ``find(directory, name)``; returns the bytes
    freed. Each removal is logged (a warning: a killed run is worth knowing about)."""
    freed = 0
    for item in find(directory, name):
        if not item.stale:
            continue
        try:
            if item.path.is_dir():
                shutil.rmtree(item.path)
            else:
                item.path.unlink()
        except OSError as exc:
            log.warning("could not remove the abandoned temporary %s (%s)", item.path, exc)
            continue
        freed += item.bytes
        log.warning("removed %s (%s), left by an interrupted run", item.path, human_bytes(item.bytes))
    return freed


def free_bytes(path: Path) -> int:
    """Free space on the file system that holds ``path`` (or its nearest existing parent)."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return shutil.disk_usage(Path.cwd()).free


def check_free(directory: Path, need: int, what: str, scratch: Iterable[Scratch] = (),
               free: Callable[[Path], int] = free_bytes) -> None:
    """Raise NotEnoughDisk when ``directory`` lacks ``need`` bytes for ``what``. ``scratch``:
    our temporaries there that are not (yet) removable; the message says what they hold, since
    they are often why the disk is full."""
    available = free(directory)
    if available >= need:
        return
    held = [s for s in scratch if s.bytes]
    detail = ""
    if held:
        total = sum(s.bytes for s in held)
        names = ", ".join(s.path.name for s in held[:3]) + (", ..." if len(held) > 3 else "")
        detail = (f"; {human_bytes(total)} more are held by unfinished temporary files of Tandem ({names}),"
                  f" removed automatically once no run has touched them for {STALE_AFTER_S / 60:.0f} minutes")
    raise NotEnoughDisk(f"{what} needs {human_bytes(need)} free in {directory}, only {human_bytes(available)} are free{detail}")


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"
