"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached afterwards in
torch's extensions dir; the set-up builds it ahead of time).

A packaged (frozen) app has no compiler and no torch headers, so it never compiles: the build
compiles the module once and ships it in ``prebuilt/`` (packaging/tandem.spec). Without it, or
when it fails to load, kernels.linear falls back to the reference kernel.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import torch

from kernels.build import COMMON, compile_avx2, cpu_supports_avx2

SOURCE = Path(__file__).with_name("linear_avx2.cpp")
PREBUILT = Path(__file__).with_name("prebuilt")
NAME = "tandem_linear_avx2"


def available() -> bool:
    if not cpu_supports_avx2():
        return False
    _module()
    return True


@functools.cache
def _module():
    if getattr(sys, "frozen", False):
        return _prebuilt()
    return compile_avx2(NAME, SOURCE, (COMMON,))


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
