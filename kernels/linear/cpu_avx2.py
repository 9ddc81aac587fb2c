"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached afterwards in
torch's extensions dir; the set-up builds it ahead of time). A packaged app loads the module
its build shipped in ``prebuilt/`` (kernels/build.py); without it, or when it fails to load,
kernels.linear falls back to the reference kernel.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from kernels.build import COMMON, compile_avx2, cpu_supports_avx2

SOURCE = Path(__file__).with_name("linear_avx2.cpp")
NAME = "tandem_linear_avx2"


def available() -> bool:
    if not cpu_supports_avx2():
        return False
    _module()
    return True


@functools.cache
def _module():
    return compile_avx2(NAME, SOURCE, (COMMON,))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear_bf16w(x, weight, bias)
