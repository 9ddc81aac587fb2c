"""AVX2 + FMA backend, compiled on first use (it shares kernels/quant_linear's int8 and
kernels/int4_linear's int4 tiles)."""
from __future__ import annotations

import functools
from pathlib import Path

from kernels.build import COMMON, compile_avx2, cpu_supports_avx2

SOURCE = Path(__file__).with_name("decoder_avx2.cpp")
HEADER = SOURCE.parent.parent / "quant_linear" / "int8_gemm.h"
INT16_INPUTS = HEADER.with_name("int16_inputs.h")
INT16_INPUTS_VNNI = HEADER.with_name("int16_inputs_vnni.h")
INT4_HEADER = SOURCE.parent.parent / "int4_linear" / "int4_gemm.h"
INT4_VNNI = INT4_HEADER.with_name("int4_gemm_vnni.h")


def available() -> bool:
    if not cpu_supports_avx2():
        return False
    _module()
    return True


@functools.cache
def _module():
    return compile_avx2("tandem_draft_decoder_avx2", SOURCE, (HEADER, INT16_INPUTS, INT16_INPUTS_VNNI, INT4_HEADER, INT4_VNNI, COMMON), ("-mf16c",))


def decoder_layer(*args) -> None:
    if len(args) == 29:  # no offsets: every layer is int8
        args = (*args, [])
    int16_inputs = bool(args[30]) if len(args) > 30 else False
    _module().decoder_layer(*args[:29], list(args[29]), int16_inputs)


def a16_isa() -> str:
    """Which tiles an int8 target's layers (int16 inputs) run: "avx512_vnni" or "avx2"."""
    return _module().a16_isa()


def int4_isa() -> str:
    """Which tiles int4 layers run: "avx512_vnni" or "avx2"."""
    return _module().int4_isa()


def int4_allow_vnni(on: bool) -> None:
    _module().int4_allow_vnni(on)
