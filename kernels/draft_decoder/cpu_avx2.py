"""AVX2 + FMA backend, compiled on first use (it shares kernels/quant_linear's int8 and
kernels/int4_linear's int4 tiles, and kernels/attention's attention)."""
from __future__ import annotations

from pathlib import Path

from kernels.build import avx2_extension

SOURCE = Path(__file__).with_name("decoder_avx2.cpp")
available, _module = avx2_extension("tandem_draft_decoder_avx2", lambda: SOURCE, uses=("quant_linear", "int4_linear", "attention"),
                                    extra_cflags=("-mf16c",))


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
