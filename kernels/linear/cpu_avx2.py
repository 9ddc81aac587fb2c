"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached afterwards in
torch's extensions dir; the set-up builds it ahead of time).

A packaged (frozen) app has no compiler and no torch headers, so it never compiles: the build
compiles the module once and ships it in ``prebuilt/`` (packaging/tandem.spec). Without it, or
when it fails to load, kernels.linear falls back to the reference kernel.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("linear_avx2.cpp")
PREBUILT = Path(__file__).with_name("prebuilt")
NAME = "tandem_linear_avx2"


def available() -> bool:
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    _module()
    return True


@functools.cache
def _module():
    if getattr(sys, "frozen", False):
        return _prebuilt()
    from torch.utils.cpp_extension import load

    # One build per checkout and source version: two checkouts sharing torch's extension dir
    # under one name would rebuild each other's copy on every load.
    digest = hashlib.sha256(str(SOURCE).encode() + SOURCE.read_bytes()).hexdigest()[:10]
    return load(
        name=f"{NAME}_{digest}",
        sources=[str(SOURCE)],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )


def _prebuilt():
    found = sorted(PREBUILT.glob(f"{NAME}_*.*")) if PREBUILT.is_dir() else []
    if not found:
        raise RuntimeError("this build carries no compiled CPU kernel")
    # The module's init symbol is named after the name it was compiled under: load it by that name.
    name = found[0].name.split(".")[0]
    spec = importlib.util.spec_from_file_location(name, found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear_bf16w(x, weight, bias)
