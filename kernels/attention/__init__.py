"""Batch-invariant causal attention for decoding and verification (see reference.py for the
specification, attention_avx2.cpp for why).

The backend is chosen once, on first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

from kernels.attention import reference
from kernels.backends import CpuBackends, package_api

backends = CpuBackends("attention", reference, "attention", isa="attention_isa")
available_backends, active_backend, fast_backend, use_backend = package_api(__name__)


def causal_attention(query, key, value, scaling):
    return backends.active.causal_attention(query, key, value, scaling)


def rotary_attention(qkv, cos, signed_sin, k_cache, v_cache, layer, start, heads, kv_heads, scaling):
    """A decoder layer's attention from its q / k / v projection in one call (see
    reference.rotary_attention): rotate, write the new keys and values into the cache, attend."""
    return backends.active.rotary_attention(qkv, cos, signed_sin, k_cache, v_cache, layer, start, heads, kv_heads, scaling)


__all__ = ["active_backend", "available_backends", "causal_attention", "fast_backend", "rotary_attention", "use_backend"]
