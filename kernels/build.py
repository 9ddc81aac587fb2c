"""Compile a kernel package's AVX2 extension with torch's cpp_extension (on first use; the
set-up does it ahead of time, so a request or a timed test never waits for a compiler)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

COMMON = Path(__file__).with_name("avx2_common.h")  # helpers every AVX2 kernel includes


def cpu_supports_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def compile_avx2(name: str, source: Path, headers: tuple[Path, ...] = (), extra_cflags: tuple[str, ...] = ()):
    """The compiled module for ``source`` (plus any ``headers`` it includes, from their folders).

    The module name carries a digest of the checkout path and the sources: checkouts share
    torch's extension dir, and two of them under one name would rebuild each other's copy on
    every load; a changed source gets its own build. ``extra_cflags``: more ISA flags (-mf16c);
    every AVX2 CPU has F16C."""
    from torch.utils.cpp_extension import load

    digest = hashlib.sha256(str(source).encode() + source.read_bytes() + b"".join(h.read_bytes() for h in headers))
    return load(
        name=f"{name}_{digest.hexdigest()[:10]}",
        sources=[str(source)],
        extra_include_paths=sorted({str(h.parent) for h in headers}),
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp", *extra_cflags],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )
