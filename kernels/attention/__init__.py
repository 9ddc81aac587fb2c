"""Batch-invariant causal attention for decoding and verification (see reference.py for the
specification, attention_avx2.cpp for why).

The backend is chosen once, on first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

from kernels.attention import reference
from kernels.backends import CpuBackends

backends = CpuBackends("attention", reference, "attention")


def available_backends() -> list[str]:
    return backends.available()


def fast_backend():
    """The compiled backend when it is the one in use, else None."""
    return backends.fast()


def use_backend(name: str) -> None:
    backends.use(name)


def causal_attention(query, key, value, scaling):
    return backends.active.causal_attention(query, key, value, scaling)


__all__ = ["available_backends", "causal_attention", "fast_backend", "use_backend"]
