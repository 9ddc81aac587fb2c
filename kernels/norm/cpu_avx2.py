"""AVX2 backend, compiled on first use with torch's cpp_extension (cached in torch's extensions
dir; the set-up builds it ahead of time)."""
from __future__ import annotations

from pathlib import Path

from kernels.build import avx2_extension

SOURCE = Path(__file__).with_name("norm_avx2.cpp")
# -ffp-contract=off: every product and sum rounded on its own, as PyTorch's separate ops round them.
available, _module = avx2_extension("tandem_norm_avx2", lambda: SOURCE, extra_cflags=("-ffp-contract=off",))


def add_rms_norm(x, delta, weight, eps):
    return tuple(_module().add_rms_norm(x, delta, weight, eps))
