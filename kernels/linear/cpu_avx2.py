"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached afterwards in
torch's extensions dir; the set-up builds it ahead of time)."""
from __future__ import annotations

import functools
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("linear_avx2.cpp")


def available() -> bool:
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    _module()
    return True


@functools.cache
def _module():
    from torch.utils.cpp_extension import load

    return load(
        name="tandem_linear_avx2",
        sources=[str(SOURCE)],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear_bf16w(x, weight, bias)
