"""AVX2 + FMA + F16C backend, compiled on first use with torch's cpp_extension (cached in
torch's extensions dir; `tandem setup` builds it ahead of time)."""
from __future__ import annotations

from pathlib import Path

import torch

from kernels.build import avx2_extension

# The tiles (int4_gemm*.h) are shared with kernels/draft_decoder.
SOURCE = Path(__file__).with_name("int4_linear_avx2.cpp")
available, _module = avx2_extension("tandem_int4_linear_avx2", lambda: SOURCE, extra_cflags=("-mf16c",))


def linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear_int4w(x, packed, scale, offset, bias)


def int4_isa() -> str:
    """Which tiles run: "avx512_vnni" (where the CPU has it) or "avx2"."""
    return _module().int4_isa()


def int4_allow_vnni(on: bool) -> None:
    """Allow the AVX-512 VNNI tiles where the CPU has them (tests run both on one machine)."""
    _module().int4_allow_vnni(on)
