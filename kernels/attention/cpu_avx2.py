"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached in torch's
extensions dir; `tandem setup` builds it ahead of time). A frozen app has no compiler: there the
backend is unavailable and the model keeps PyTorch's own attention."""
from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("attention_avx2.cpp")


def available() -> bool:
    if getattr(sys, "frozen", False) or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    _module()
    return True


@functools.cache
def _module():
    from torch.utils.cpp_extension import load

    # One build per checkout and source version (checkouts share torch's extension dir).
    digest = hashlib.sha256(str(SOURCE).encode() + SOURCE.read_bytes()).hexdigest()[:10]
    return load(
        name=f"tandem_attention_avx2_{digest}",
        sources=[str(SOURCE)],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    return _module().causal_attention(query, key, value, scaling)
