"""AVX2 + FMA backend, compiled on first use (it shares kernels/quant_linear's int8 tiling)."""
from __future__ import annotations

import functools
from pathlib import Path

from kernels.build import COMMON, compile_avx2, cpu_supports_avx2

SOURCE = Path(__file__).with_name("decoder_avx2.cpp")
HEADER = SOURCE.parent.parent / "quant_linear" / "int8_gemm.h"


def available() -> bool:
    if not cpu_supports_avx2():
        return False
    _module()
    return True


@functools.cache
def _module():
    return compile_avx2("tandem_draft_decoder_avx2", SOURCE, (HEADER, COMMON))


def decoder_layer(*args) -> None:
    _module().decoder_layer(*args)
