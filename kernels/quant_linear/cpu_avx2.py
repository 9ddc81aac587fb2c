"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached in torch's
extensions dir; `tandem setup` builds it ahead of time)."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("quant_linear_avx2.cpp")
HEADER = SOURCE.with_name("int8_gemm.h")  # the tiling code, shared with kernels/draft_decoder


def available() -> bool:
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    _module()
    return True


@functools.cache
def _module():
    from torch.utils.cpp_extension import load

    # One build per checkout and source version (checkouts share torch's extension dir).
    digest = hashlib.sha256(str(SOURCE).encode() + SOURCE.read_bytes() + HEADER.read_bytes()).hexdigest()[:10]
    return load(
        name=f"tandem_quant_linear_avx2_{digest}",
        sources=[str(SOURCE)],
        extra_include_paths=[str(SOURCE.parent)],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )


def linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear_int8w(x, q, scale, bias)
