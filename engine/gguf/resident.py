"""Keep a GGUF file's mapped weights in RAM (``mlock``, as llama.cpp's ``--mlock``; or a private copy).

A GGUF target computes straight from its memory-mapped file. When another program takes most
of the RAM, the kernel drops those pages like any page cache, and every step reads them back
from disk: a decode step measured 700-900 ms where it takes ~50. Locking the mapping keeps the
pages in RAM whatever else runs. It needs the locked-memory limit (``ulimit -l``,
RLIMIT_MEMLOCK) to cover the file, or the privilege to exceed it, and most desktops set that
limit to a few MB. Where it does not cover the file, the weights become a private copy instead:
the mapping is copy-on-write, so writing each page once (its own byte back) turns it into
memory of this process's own, which the kernel cannot drop as cache (with no swap it stays; with
swap it is swapped out only after page cache goes, and only under real need), at the cost of no
longer sharing those pages with another program reading the same file (llama.cpp does the same
with ``--no-mmap``). Where there is not the free memory for the copy, the caller gets a
``CannotKeepResident`` that says why and runs as before.

Python's mmap has no mlock, so this calls the C library's through ctypes (POSIX only).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import mmap
import os
import sys
from dataclasses import dataclass

from engine.gguf.reader import GgufFile


class CannotKeepResident(RuntimeError):
    """The weights could not be locked in RAM; the message says why and what to do."""


@dataclass(frozen=True)
class Resident:
    """``locked_bytes`` of ``name`` are held in RAM until the process ends: locked (``how`` =
    "mlock") or copied into this process's own memory ("private copy", ``why`` saying why)."""

    name: str
    locked_bytes: int
    how: str = "mlock"
    why: str = ""
    #: Bytes of the file's matrices held in RAM already as the CPU kernels' own layout (not locked again).
    elsewhere_bytes: int = 0

    def describe(self) -> str:
        held = f"{self.name}: {self.locked_bytes / 2**20:,.0f} MiB of weights kept in RAM"
        also = (f"; {self.elsewhere_bytes / 2**20:,.0f} MiB more held as the CPU kernels' own layout"
                if self.elsewhere_bytes else "")
        if self.how == "mlock":
            return f"{held} (mlock){also}"
        return f"{held} as a private copy ({self.why}){also}"


def _limit_text() -> str:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, OSError, ValueError):
        return "the locked-memory limit"
    if soft == resource.RLIM_INFINITY:
        return "the locked-memory limit (unlimited, so RAM itself)"
    return f"the locked-memory limit of {soft / 2**20:,.0f} MiB (ulimit -l)"


# Memory the private copy leaves free beside it: the copy must not be what pushes the system
# into the pressure it is meant to survive.
COPY_HEADROOM = 512 * 2**20


def keep_resident(file: GgufFile, allow_copy: bool = True, available: int | None = None, held_elsewhere=()) -> Resident:
    """Lock every mapping of ``file`` in RAM (reading in what is not there yet); where the
    locked-memory limit forbids it and ``allow_copy``, make the weights a private copy instead.
    ``available``: the bytes of memory free for the copy (default: what the system reports).
    ``held_elsewhere``: tensors viewing the file whose bytes the model no longer reads (the
    kernels hold their own layout of them in memory): their whole pages are left out, not read
    back in to be held twice."""
    if sys.platform == "win32" or not hasattr(os, "sysconf"):
        raise CannotKeepResident(f"{file.name}: keeping weights in RAM is not supported on this system")
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.munlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    skipped = [(view.data_ptr(), view.numel() * view.element_size()) for view in held_elsewhere]
    spans = [(mapped, start, end) for mapped in file._maps for start, end in _spans_to_hold(mapped, skipped)]
    total = sum(end - start for _, start, end in spans)
    elsewhere = sum(int(m.shape[0]) for m in file._maps) - total
    locked = 0
    for i, (mapped, start, end) in enumerate(spans):
        if libc.mlock(ctypes.c_void_p(mapped.ctypes.data + start), ctypes.c_size_t(end - start)) != 0:
            err = ctypes.get_errno()
            for done, a, b in spans[:i]:  # all or nothing
                libc.munlock(ctypes.c_void_p(done.ctypes.data + a), ctypes.c_size_t(b - a))
            why = f"mlock: {os.strerror(err)}; it needs {_limit_text()} to cover them"
            if allow_copy:
                return dataclasses.replace(_private_copy(file, spans, total, why, available), elsewhere_bytes=elsewhere)
            raise CannotKeepResident(
                f"{file.name}: could not keep its {total / 2**20:,.0f} MiB of weights in RAM "
                f"({why}): raise it or run without --mlock (the weights then stay memory-mapped, as by default)")
        locked += end - start
    return Resident(file.name, locked, elsewhere_bytes=elsewhere)


def _spans_to_hold(mapped, skipped: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) byte offsets of ``mapped`` to hold: all of it but the whole pages inside the
    ``skipped`` (address, bytes) ranges (a page shared with bytes still read is held)."""
    base, size, page = mapped.ctypes.data, int(mapped.shape[0]), mmap.PAGESIZE
    cuts = sorted((-(-(ptr - base) // page) * page, (ptr - base + n) // page * page) for ptr, n in skipped
                  if base <= ptr and ptr + n <= base + size)
    spans, at = [], 0
    for start, end in cuts:
        if end <= start:
            continue
        if start > at:
            spans.append((at, start))
        at = max(at, end)
    if at < size:
        spans.append((at, size))
    return spans


def _private_copy(file: GgufFile, spans, total: int, mlock_refused: str, available: int | None) -> Resident:
    """Write each page of ``spans`` of ``file``'s copy-on-write mappings once with its own byte:
    every page becomes this process's memory, the same bytes at the same addresses (the tensors
    viewing them are untouched)."""
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    if total + COPY_HEADROOM > available:
        raise CannotKeepResident(
            f"{file.name}: could not keep its {total / 2**20:,.0f} MiB of weights in RAM ({mlock_refused}), "
            f"nor copy them: {available / 2**20:,.0f} MiB of memory is free, and a copy needs "
            f"{(total + COPY_HEADROOM) / 2**20:,.0f}. Free some memory, raise the limit, or run without --mlock "
            f"(the weights then stay memory-mapped, as by default)")
    for mapped, start, end in spans:
        firsts = mapped[start:end:mmap.PAGESIZE]
        firsts[:] = firsts.copy()  # a copy: numpy skips assigning a view to itself
    return Resident(file.name, total, how="private copy", why=f"{mlock_refused}, so copied instead")
