"""A drafter LM head restricted to a token subset (see reference.py for the specification).

The backend is chosen once, on first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

import logging
import os

from kernels.draft_head import reference

log = logging.getLogger(__name__)

_BACKENDS = {"reference": reference}
_active = None


def available_backends() -> list[str]:
    if len(_BACKENDS) == 1 and not os.environ.get("TANDEM_NO_CPU_KERNELS"):
        try:
            from kernels.draft_head import cpu_avx2

            if cpu_avx2.available():
                _BACKENDS["cpu_avx2"] = cpu_avx2
        except Exception as exc:  # no compiler, unsupported CPU: the reference still works
            log.warning("fast draft head kernel unavailable (%s)", exc)
    return sorted(_BACKENDS)


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
        raise ValueError(f"unknown draft_head backend {name!r}; available: {sorted(_BACKENDS)}")
    _active = _BACKENDS[name]


def subset_logits(hidden, weight, scale=None):
    return _backend().subset_logits(hidden, weight, scale)


def to_vocab(values, ids, vocab_size):
    return _backend().to_vocab(values, ids, vocab_size)


def greedy_ids(logits, ids):
    return _backend().greedy_ids(logits, ids)


__all__ = ["available_backends", "greedy_ids", "subset_logits", "to_vocab", "use_backend"]
