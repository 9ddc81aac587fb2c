"""Letting go of a thread's OpenMP workers when another thread computes next.

torch computes on CPUs through OpenMP, and GNU OpenMP (libgomp, which torch's Linux wheels
ship) keeps a pool of worker threads for every thread that has started a parallel region. A
thread that loaded the models (the server's main thread, the app's engine thread before it hands
the session to the server's) keeps its pool after it stops computing. Once the pools together
hold more threads than the machine has cores, libgomp stops spinning at its barriers (its
"throttled" spin count: ~100 iterations) and every barrier of every kernel call puts threads to
sleep and wakes them again. A decode step is a few hundred such calls: measured on 2 cores,
default pair, 672-token chat prompt, a step took 48-50 ms on a second thread while the loading
thread's pool lived, 34 ms once it was released (and 35 ms on the loading thread itself), the
OpenAI server's replies ran at 56-58 ms a token against 31-33 for the same decoding in-process.

``release_openmp_workers`` pauses the calling thread's pool (OpenMP 5's
``omp_pause_resource_all``); libgomp recreates it the next time that thread computes. It is
called where a thread stops computing for now: at the end of a session's load and of every
request. Why ctypes: torch exposes no call for it, and the runtime is the library torch loaded
(found among the process's mapped libraries, so never a second copy). Only libgomp is paused:
LLVM's OpenMP shares one pool between threads, and there a hard pause would stop the runtime
under every thread at once.
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

log = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: libgomp frees the calling thread's pool for either kind


_found: list[ctypes.CDLL] = []  # the runtime, once found (looked for again until then)


def _libgomp() -> ctypes.CDLL | None:
    """The GNU OpenMP runtime this process has loaded (torch's), or None (not yet, or none)."""
    if _found:
        return _found[0]
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # not Linux: torch does not compute through libgomp there
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "/libgomp" in line}
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)  # already loaded: the same runtime, one more reference
        except OSError:
            continue
        if hasattr(lib, "omp_pause_resource_all"):
            lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            lib.omp_pause_resource_all.restype = ctypes.c_int
            _found.append(lib)
            return lib
    return None


def releases_openmp_workers() -> bool:
    """Whether this process computes through a runtime whose workers can be released."""
    return _libgomp() is not None


def release_openmp_workers() -> bool:
    """End the calling thread's OpenMP worker threads (it must not be inside a parallel region:
    between torch calls it never is). True when released; False where there is no such runtime
    or it refused."""
    lib = _libgomp()
    if lib is None:
        return False
    released = lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
    if not released:
        log.debug("the OpenMP runtime kept this thread's workers")
    return released
