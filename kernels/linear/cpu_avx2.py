"""AVX2 + FMA backend, compiled on first use with torch's cpp_extension (cached afterwards in
torch's extensions dir; the set-up builds it ahead of time). A packaged app loads the module
its build shipped in ``prebuilt/`` (kernels/build.py); without it, or when it fails to load,
kernels.linear falls back to the reference kernel.
"""
from __future__ import annotations

from pathlib import Path

import torch

from kernels.build import avx2_extension

SOURCE = Path(__file__).with_name("linear_avx2.cpp")
available, _module = avx2_extension("tandem_linear_avx2", lambda: SOURCE)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module().linear_bf16w(x, weight, bias)
