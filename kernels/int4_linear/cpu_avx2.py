"""AVX2 + FMA + F16C backend, compiled on first use with torch's cpp_extension (cached in
torch's extensions dir; `tandem setup` builds it ahead of time)."""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from kernels.build import COMMON, compile_avx2, cpu_supports_avx2

SOURCE = Path(__file__).with_name("int4_linear_avx2.cpp")
HEADER = SOURCE.with_name("int4_gemm.h")  # the tiles, shared with kernels/draft_decoder
VNNI_HEADER = SOURCE.with_name("int4_gemm_vnni.h")


def available() -> bool:
    if not cpu_supports_avx2():
        return False
    _module()
    return True


@functools.cache
def _module():
    return compile_avx2("tandem_int4_linear_avx2", SOURCE, (HEADER, VNNI_HEADER, COMMON), ("-mf16c",))


def linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear_int4w(x, packed, scale, offset, bias)


def int4_isa() -> str:
    """Which tiles run: "avx512_vnni" (where the CPU has it) or "avx2"."""
    return _module().int4_isa()


def int4_allow_vnni(on: bool) -> None:
    """Allow the AVX-512 VNNI tiles where the CPU has them (tests run both on one machine)."""
    _module().int4_allow_vnni(on)
