"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached in torch's
extensions dir; `tandem setup` builds it ahead of time)."""
from __future__ import annotations

from pathlib import Path

import torch

from kernels.build import avx2_extension

# The tiles (int8_gemm.h, int16_inputs*.h) are shared with kernels/draft_decoder.
SOURCE = Path(__file__).with_name("quant_linear_avx2.cpp")
available, _module = avx2_extension("tandem_quant_linear_avx2", lambda: SOURCE)


def linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear_int8w(x, q, scale, bias)


def linear_a16(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear_int8w_a16(x, q, scale, bias)


def a16_isa() -> str:
    """Which tiles ``linear_a16`` runs for widths that are a multiple of 32: "avx512_vnni" or "avx2"."""
    return _module().a16_isa()


def a16_allow_vnni(on: bool) -> None:
    """Let ``linear_a16`` use its AVX-512 VNNI tiles where the CPU has them (the default)."""
    _module().a16_allow_vnni(on)
