"""AVX2 + FMA backend, compiled on first use (it shares kernels/quant_linear's int8 tiling)."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("decoder_avx2.cpp")
INCLUDE = SOURCE.parent.parent / "quant_linear"
HEADER = INCLUDE / "int8_gemm.h"


def available() -> bool:
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    _module()
    return True


@functools.cache
def _module():
    from torch.utils.cpp_extension import load

    # One build per checkout and source version (checkouts share torch's extension dir).
    digest = hashlib.sha256(str(SOURCE).encode() + SOURCE.read_bytes() + HEADER.read_bytes()).hexdigest()[:10]
    return load(
        name=f"tandem_draft_decoder_avx2_{digest}",
        sources=[str(SOURCE)],
        extra_include_paths=[str(INCLUDE)],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )


def decoder_layer(*args) -> None:
    _module().decoder_layer(*args)
