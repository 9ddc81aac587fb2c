"""int8 weight-only linear layers for drafters (weights at half the bytes of bf16).

Why: a draft step reads every drafter weight once and, on CPUs, is bound by memory bandwidth,
so the bytes per weight set the draft cost c that decides how far speculation can go. A drafter
may run at any precision without touching losslessness: the target verifies every token.

The backend is chosen once, on first use (the AVX2 one is compiled then); ``use_backend(name)``
overrides it (tests). ``quantize`` is the same for every backend.
"""
from __future__ import annotations

from kernels.backends import CpuBackends
from kernels.quant_linear import reference
from kernels.quant_linear.reference import dequantize, quantize

backends = CpuBackends("quant_linear", reference, "int8 linear")


def available_backends() -> list[str]:
    return backends.available()


def fast_backend():
    """The best non-reference backend, or None (then quantizing a drafter would only slow it)."""
    return backends.fast()


def active_backend() -> str:
    """The name of the backend ``linear`` runs on now (choosing the default on first call)."""
    return backends.active_name()


def use_backend(name: str) -> None:
    backends.use(name)


def linear(x, q, scale, bias=None):
    """y = x @ (q * scale[:, None])^T + bias; see reference.py for the exact specification."""
    return backends.active.linear(x, q, scale, bias)


def linear_a16(x, q, scale, bias=None):
    """As ``linear`` with x quantized to int16 per 256 values first (int8 targets: cheaper
    verification); row layout only. See reference.py."""
    return backends.active.linear_a16(x, q, scale, bias)


def tile_set_detail(backend_name: str, isa) -> str:
    """What a kernel report adds to a compiled backend's name: " (AVX-512 VNNI)" where its tiles
    use it (int16_inputs.h, shared by this package and kernels/draft_decoder; int4_gemm.h, shared
    by kernels/int4_linear and kernels/draft_decoder: both follow the CPU)."""
    return " (AVX-512 VNNI)" if backend_name == "cpu_avx2" and isa() == "avx512_vnni" else ""


def backend_detail() -> str:
    from kernels.quant_linear import cpu_avx2

    return tile_set_detail(active_backend(), cpu_avx2.a16_isa)


__all__ = ["active_backend", "available_backends", "backend_detail", "available_backends", "dequantize", "fast_backend", "linear", "linear_a16", "quantize", "use_backend"]
