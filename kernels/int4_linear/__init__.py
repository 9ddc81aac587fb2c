"""int4 weight-only linear layers (a quarter of bf16's bytes, plus a scale and offset per 32).

Why: a decode step reads every weight once and is bound by memory bandwidth on a CPU, so
4-bit weights make a step ~3x cheaper than bf16. Verification stays cheap too: the kernel
dequantizes each weight group once into registers and reuses it for every row of the call
(the stock int4 kernels cost nearly linearly in the rows), and it computes each row with the
same instructions whatever the row count, so speculation stays token-identical on it.

The backend is chosen once, on first use (the AVX2 one is compiled then); ``use_backend(name)``
overrides it (tests). ``quantize`` is the same for every backend.
"""
from __future__ import annotations

from kernels.backends import CpuBackends, package_api
from kernels.int4_linear import reference
from kernels.int4_linear.reference import GROUP, dequantize, quantize

backends = CpuBackends("int4_linear", reference, "int4 linear", isa="int4_isa")
available_backends, active_backend, fast_backend, use_backend = package_api(__name__)


def linear(x, packed, scale, offset, bias=None):
    """y = x @ dequantize(packed, scale, offset)^T + bias; see reference.py for the specification."""
    return backends.active.linear(x, packed, scale, offset, bias)


__all__ = ["GROUP", "active_backend", "available_backends", "dequantize", "fast_backend", "linear", "quantize", "use_backend"]
