"""int8 weight-only linear layers for drafters (weights at half the bytes of bf16).

Why: a draft step reads every drafter weight once and, on CPUs, is bound by memory bandwidth,
so the bytes per weight set the draft cost c that decides how far speculation can go. A drafter
may run at any precision without touching losslessness: the target verifies every token.

The backend is chosen once, on first use (the AVX2 one is compiled then); ``use_backend(name)``
overrides it (tests). ``quantize`` is the same for every backend.
"""
from __future__ import annotations

import logging
import os

from kernels.quant_linear import reference
from kernels.quant_linear.reference import dequantize, quantize

log = logging.getLogger(__name__)

_BACKENDS = {"reference": reference}
_active = None


def _load_fast() -> None:
    if os.environ.get("TANDEM_NO_CPU_KERNELS"):
        return
    try:
        from kernels.quant_linear import cpu_avx2

        if cpu_avx2.available():
            _BACKENDS["cpu_avx2"] = cpu_avx2
    except Exception as exc:  # no compiler, unsupported CPU: the reference still works
        log.warning("fast int8 linear kernel unavailable (%s)", exc)


def available_backends() -> list[str]:
    if len(_BACKENDS) == 1:
        _load_fast()
    return sorted(_BACKENDS)


def fast_backend():
    """The best non-reference backend, or None (then quantizing a drafter would only slow it)."""
    global _active
    if _active is None:
        available_backends()
        _active = _BACKENDS.get("cpu_avx2", reference)
    return None if _active is reference else _active


def active_backend() -> str:
    """The name of the backend ``linear`` runs on now (choosing the default on first call)."""
    fast_backend()
    return next(name for name, module in _BACKENDS.items() if module is _active)


def use_backend(name: str) -> None:
    global _active
    available_backends()
    if name not in _BACKENDS:
        raise ValueError(f"unknown quant_linear backend {name!r}; available: {sorted(_BACKENDS)}")
    _active = _BACKENDS[name]


def linear(x, q, scale, bias=None):
    """y = x @ (q * scale[:, None])^T + bias; see reference.py for the exact specification."""
    if _active is None:
        fast_backend()
    return _active.linear(x, q, scale, bias)


__all__ = ["active_backend", "available_backends", "dequantize", "fast_backend", "linear", "quantize", "use_backend"]
