"""Batch-invariant causal attention for decoding and verification (see reference.py for the
specification, attention_avx2.cpp for why).

The backend is chosen once, on first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

import logging
import os

from kernels.attention import reference

log = logging.getLogger(__name__)

_BACKENDS = {"reference": reference}
_active = None


def available_backends() -> list[str]:
    if len(_BACKENDS) == 1 and not os.environ.get("TANDEM_NO_CPU_KERNELS"):
        try:
            from kernels.attention import cpu_avx2

            if cpu_avx2.available():
                _BACKENDS["cpu_avx2"] = cpu_avx2
        except Exception as exc:  # no compiler, unsupported CPU: the reference still works
            log.warning("fast attention kernel unavailable (%s)", exc)
    return sorted(_BACKENDS)


def fast_backend():
    """The compiled backend, or None where it cannot run."""
    available_backends()
    return _BACKENDS.get("cpu_avx2")


def _backend():
    global _active
    if _active is None:
        available_backends()
        _active = _BACKENDS.get("cpu_avx2", reference)
    return _active


def use_backend(name: str) -> None:
    global _active
    available_backends()
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(_BACKENDS)}")
    _active = _BACKENDS[name]


def causal_attention(query, key, value, scaling):
    return _backend().causal_attention(query, key, value, scaling)


__all__ = ["available_backends", "causal_attention", "fast_backend", "use_backend"]
