"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached in torch's
extensions dir; `tandem setup` builds it ahead of time)."""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from kernels.build import COMMON, compile_avx2, cpu_supports_avx2

SOURCE = Path(__file__).with_name("quant_linear_avx2.cpp")
HEADER = SOURCE.with_name("int8_gemm.h")  # the tiling code, shared with kernels/draft_decoder
INT16_INPUTS = SOURCE.with_name("int16_inputs.h")
INT16_INPUTS_VNNI = SOURCE.with_name("int16_inputs_vnni.h")


def available() -> bool:
    if not cpu_supports_avx2():
        return False
    _module()
    return True


@functools.cache
def _module():
    return compile_avx2("tandem_quant_linear_avx2", SOURCE, (HEADER, INT16_INPUTS, INT16_INPUTS_VNNI, COMMON))


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
