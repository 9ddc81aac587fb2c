"""int8 weight-only linear layers for drafters (weights at half the bytes of bf16).

Why: a draft step reads every drafter weight once and, on CPUs, is bound by memory bandwidth,
so the bytes per weight set the draft cost c that decides how far speculation can go. A drafter
may run at any precision without touching losslessness: the target verifies every token.

The backend is chosen once, on first use (the AVX2 one is compiled then); ``use_backend(name)``
overrides it (tests). ``quantize`` is the same for every backend.
"""
from __future__ import annotations

from kernels.backends import CpuBackends, package_api
from kernels.quant_linear import reference
from kernels.quant_linear.reference import dequantize, quantize

# isa: the tiles linear_a16 runs (int16_inputs.h, shared with kernels/draft_decoder), for reports.
backends = CpuBackends("quant_linear", reference, "int8 linear", isa="a16_isa")
available_backends, active_backend, fast_backend, use_backend = package_api(__name__)


def linear(x, q, scale, bias=None):
    """y = x @ (q * scale[:, None])^T + bias; see reference.py for the exact specification."""
    return backends.active.linear(x, q, scale, bias)


def linear_a16(x, q, scale, bias=None):
    """As ``linear`` with x quantized to int16 per 256 values first (int8 targets: cheaper
    verification); row layout only. See reference.py."""
    return backends.active.linear_a16(x, q, scale, bias)


__all__ = ["active_backend", "available_backends", "dequantize", "fast_backend", "linear", "linear_a16", "quantize", "use_backend"]
