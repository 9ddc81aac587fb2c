"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached in torch's
extensions dir; `tandem setup` builds it ahead of time). A packaged app loads the module its
build shipped (kernels/build.py); without it the model keeps PyTorch's own attention."""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from kernels.build import COMMON, compile_avx2, cpu_supports_avx2

SOURCE = Path(__file__).with_name("attention_avx2.cpp")


def available() -> bool:
    if not cpu_supports_avx2():
        return False
    _module()
    return True


@functools.cache
def _module():
    return compile_avx2("tandem_attention_avx2", SOURCE, (COMMON,))


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    return _module().causal_attention(query, key, value, scaling)
