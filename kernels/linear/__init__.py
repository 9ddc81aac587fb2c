"""bf16-weight linear layers whose cost barely grows with the number of rows.

Why: on CPUs without native bf16 matmul (AVX2, no AVX-512 BF16) PyTorch's bf16 linear costs
about 0.6 of a one-token step for every extra row, so verifying k drafted tokens costs ~k steps
and speculation cannot pay. The AVX2 backend streams each weight row from memory once, widens it
to fp32 in registers and applies it to all M rows: for the small M of decoding and verification
the cost stays that of reading the weights once.

Each output row is computed with the same instruction sequence whatever M is, so results are
batch-invariant: verifying k+1 tokens gives bit-identical logits to decoding them one by one,
which keeps greedy speculation token-identical to plain decoding in bf16 too.
"""
from __future__ import annotations

import logging
import os

from kernels.linear import reference

log = logging.getLogger(__name__)

_BACKENDS = {"reference": reference}
_active = None


def _load_fast() -> None:
    if os.environ.get("TANDEM_NO_CPU_KERNELS"):
        return
    try:
        from kernels.linear import cpu_avx2

        if cpu_avx2.available():
            _BACKENDS["cpu_avx2"] = cpu_avx2
    except Exception as exc:  # no compiler, unsupported CPU: the reference still works
        log.warning("fast CPU linear kernel unavailable (%s); using stock PyTorch", exc)


def available_backends() -> list[str]:
    if len(_BACKENDS) == 1:
        _load_fast()
    return sorted(_BACKENDS)


def fast_backend():
    """The best non-reference backend, or None. Loaded (and compiled) on first call."""
    global _active
    if _active is None:
        available_backends()
        _active = _BACKENDS.get("cpu_avx2", reference)
    return None if _active is reference else _active


def use_backend(name: str) -> None:
    global _active
    available_backends()
    if name not in _BACKENDS:
        raise ValueError(f"unknown linear backend {name!r}; available: {sorted(_BACKENDS)}")
    _active = _BACKENDS[name]


def linear(x, weight, bias=None):
    if _active is None:
        fast_backend()
    return _active.linear(x, weight, bias)
