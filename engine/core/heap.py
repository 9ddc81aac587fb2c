"""Handing memory freed by the C heap back to the operating system.

Converting weights makes fp32 temporaries of a few MB per layer. glibc serves those from its heap
once its mmap threshold has grown past them, and keeps the freed chunks: measured on the default
pair, quantizing the 0.5B drafter left ~600 MB of them resident, and loading it twice in a row
peaked 1 GB apart. Trimming after each batch of layers keeps the peak at what the weights hold.
"""
from __future__ import annotations

import ctypes
import sys
from functools import cache


@cache
def _trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # another C library (musl): nothing to trim
        return None


def release_freed_memory() -> None:
    """Return the heap's free pages to the OS (Linux/glibc; a no-op elsewhere)."""
    trim = _trim()
    if trim is not None:
        trim(0)
