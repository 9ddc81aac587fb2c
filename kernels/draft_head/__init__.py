"""A drafter LM head restricted to a token subset (see reference.py for the specification).

The backend is chosen once, on first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

from kernels.backends import CpuBackends, package_api
from kernels.draft_head import reference

backends = CpuBackends("draft_head", reference, "draft head")
available_backends, active_backend, fast_backend, use_backend = package_api(__name__)


def subset_logits(hidden, weight, scale=None):
    return backends.active.subset_logits(hidden, weight, scale)


def to_vocab(values, ids, vocab_size):
    return backends.active.to_vocab(values, ids, vocab_size)


def greedy_ids(logits, ids):
    return backends.active.greedy_ids(logits, ids)


__all__ = ["active_backend", "available_backends", "fast_backend", "greedy_ids", "subset_logits", "to_vocab", "use_backend"]
