"""AVX2 + FMA + F16C backend (with AVX-512 VNNI and AMX-INT8 tiles where the CPU has them), compiled on first
use with torch's cpp_extension (cached in torch's extensions dir; the set-up builds it ahead)."""
from __future__ import annotations

from pathlib import Path

import torch

from kernels.build import avx2_extension
from kernels.gguf_linear.blocks import SUPPORTED_TYPES, T

SOURCE = Path(__file__).with_name("gguf_linear_avx2.cpp")
TYPES = frozenset(SUPPORTED_TYPES)  # the types these tiles compute (the others run on the reference)
PACKED_TYPES = frozenset({T.Q4_K, T.Q6_K})  # the types the AVX2 and VNNI tiles lay out again (``pack``)
# -ffp-contract=off: the contract rounds each fp32 product and sum on its own (reference.py).
available, _module = avx2_extension("tandem_gguf_linear_avx2", lambda: SOURCE, extra_cflags=("-mf16c", "-ffp-contract=off"))


_NONE = torch.empty(0)  # no bias, no packed layout


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear(x, w.raw, _NONE if w.packed is None else w.packed, int(w.qtype), w.n, w.k, bias)


def linear_group(x: torch.Tensor, weights, biases) -> torch.Tensor:
    return _module().linear_group(x, [w.raw for w in weights], [_NONE if w.packed is None else w.packed for w in weights],
                                  [int(w.qtype) for w in weights], [w.n for w in weights], weights[0].k,
                                  [_NONE if b is None else b for b in biases])


def packed_types() -> frozenset:
    """Q4_K and Q6_K where the AVX2 tiles or the VNNI tiles run; none where AMX tiles run (they read
    the file's rows, and a prefill there would need both copies)."""
    return PACKED_TYPES if gguf_isa() in ("avx2", "avx512_vnni") else frozenset()


def pack(raw: torch.Tensor, qtype, n: int, k: int) -> torch.Tensor | None:
    """The weight laid out again for the tiles in use (Q4_K, Q6_K: in groups of 8 rows for the AVX2
    tiles, of 16 for the VNNI tiles) where they have a layout of their own; None where the file's layout is
    what runs."""
    if qtype not in packed_types():
        return None
    return _module().pack(raw, int(qtype), n, k)


def gguf_isa() -> str:
    """Which tiles run: "amx_int8" (Q4_K / Q6_K against many rows on AMX, the rest on VNNI),
    "avx512_vnni" (where the CPU has them) or "avx2"."""
    return _module().gguf_isa()


def gguf_allow_vnni(on: bool) -> None:
    """Allow the AVX-512 VNNI tiles where the CPU has them (tests run both on one machine)."""
    _module().gguf_allow_vnni(on)


def gguf_allow_packed(on: bool) -> None:
    """Let the AVX2 tiles compute from the layouts ``pack`` made (on by default); off, they read
    the file's rows (tests and benchmarks compare the two in one process)."""
    _module().gguf_allow_packed(on)


def gguf_allow_prefill(on: bool) -> None:
    """Allow the VNNI tiles of 16 weight rows for many input rows (tests compare their bits)."""
    _module().gguf_allow_prefill(on)


def gguf_allow_amx(on: bool) -> None:
    """Allow the AMX-INT8 tiles where the CPU and the OS have them (tests compare their bits)."""
    _module().gguf_allow_amx(on)


def gguf_amx_rows(rows: int = 0) -> int:
    """Set the input rows from which Q4_K / Q6_K take the AMX tiles (0: leave it); returns the
    previous value (tests run every row count on them)."""
    return _module().gguf_amx_rows(rows)
