"""Keep a GGUF file's mapped weights in RAM (``mlock``), as llama.cpp's ``--mlock`` does.

A GGUF target computes straight from its memory-mapped file. When another program takes most
of the RAM, the kernel drops those pages like any page cache, and every step reads them back
from disk: a decode step measured 916 ms where it takes ~60. Locking the mapping keeps the
pages in RAM whatever else runs. It needs the locked-memory limit (``ulimit -l``,
RLIMIT_MEMLOCK) to cover the file, or the privilege to exceed it; where it does not, the
caller gets a ``CannotKeepResident`` that says so and runs as before.

Python's mmap has no mlock, so this calls the C library's through ctypes (POSIX only).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from dataclasses import dataclass

from engine.gguf.reader import GgufFile


class CannotKeepResident(RuntimeError):
    """The weights could not be locked in RAM; the message says why and what to do."""


@dataclass(frozen=True)
class Resident:
    """``locked_bytes`` of ``name`` are held in RAM until the process ends."""

    name: str
    locked_bytes: int

    def describe(self) -> str:
        return f"{self.name}: {self.locked_bytes / 2**20:,.0f} MiB of weights kept in RAM (mlock)"


def _limit_text() -> str:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, OSError, ValueError):
        return "the locked-memory limit"
    if soft == resource.RLIM_INFINITY:
        return "the locked-memory limit (unlimited, so RAM itself)"
    return f"the locked-memory limit of {soft / 2**20:,.0f} MiB (ulimit -l)"


def keep_resident(file: GgufFile) -> Resident:
    """Lock every mapping of ``file`` in RAM (reading in what is not there yet)."""
    if sys.platform == "win32" or not hasattr(os, "sysconf"):
        raise CannotKeepResident(f"{file.name}: keeping weights in RAM is not supported on this system")
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    total = sum(int(m.shape[0]) for m in file._maps)
    locked = 0
    for mapped in file._maps:
        size = int(mapped.shape[0])
        if libc.mlock(ctypes.c_void_p(mapped.ctypes.data), ctypes.c_size_t(size)) != 0:
            err = ctypes.get_errno()
            for done in file._maps[: file._maps.index(mapped)]:  # all or nothing
                libc.munlock(ctypes.c_void_p(done.ctypes.data), ctypes.c_size_t(int(done.shape[0])))
            raise CannotKeepResident(
                f"{file.name}: could not keep its {total / 2**20:,.0f} MiB of weights in RAM "
                f"({os.strerror(err)}): it needs {_limit_text()} to cover them; raise it or run without "
                f"--mlock (the weights then stay memory-mapped, as by default)")
        locked += size
    return Resident(file.name, locked)
