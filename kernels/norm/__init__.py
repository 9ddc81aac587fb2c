"""A decoder's residual add and the RMSNorm after it, in one call (see reference.py for the
specification, norm_avx2.cpp for why).

The backend is chosen once, on first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

from kernels.backends import CpuBackends, package_api
from kernels.norm import reference

backends = CpuBackends("norm", reference, "residual RMS norm")
available_backends, active_backend, fast_backend, use_backend = package_api(__name__)


def add_rms_norm(x, delta, weight, eps):
    """(x + delta, RMSNorm(x + delta) * weight): the residual stream after a block and the next
    block's normed input."""
    return backends.active.add_rms_norm(x, delta, weight, eps)


__all__ = ["active_backend", "add_rms_norm", "available_backends", "fast_backend", "use_backend"]
