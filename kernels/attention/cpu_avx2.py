"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached in torch's
extensions dir; `tandem setup` builds it ahead of time). A packaged app loads the module its
build shipped (kernels/build.py); without it the model keeps PyTorch's own attention."""
from __future__ import annotations

from pathlib import Path

import torch

from kernels.build import avx2_extension

SOURCE = Path(__file__).with_name("attention_avx2.cpp")
available, _module = avx2_extension("tandem_attention_avx2", lambda: SOURCE, extra_cflags=("-mf16c",))


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    return _module().causal_attention(query, key, value, scaling)


def rotary_attention(qkv, cos, signed_sin, k_cache, v_cache, layer: int, start: int, heads: int, kv_heads: int,
                     scaling: float) -> torch.Tensor:
    return _module().rotary_attention(qkv, cos, signed_sin, k_cache, v_cache, layer, start, heads, kv_heads, scaling)


def attention_isa() -> str:
    """Which partials run: "avx512_vnni" (16 lanes, where the CPU has AVX-512) or "avx2"."""
    return _module().attention_isa()


def attention_allow_avx512(on: bool) -> None:
    """Allow the 16-lane partials where the CPU has AVX-512 (tests run both on one machine)."""
    _module().attention_allow_avx512(on)
