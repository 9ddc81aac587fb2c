"""A drafter LM head restricted to a token subset (see reference.py for the specification).

The backend is chosen once, on first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

from kernels.backends import CpuBackends
from kernels.draft_head import reference

backends = CpuBackends("draft_head", reference, "draft head")


def available_backends() -> list[str]:
    return backends.available()


def use_backend(name: str) -> None:
    backends.use(name)


def subset_logits(hidden, weight, scale=None):
    return backends.active.subset_logits(hidden, weight, scale)


def to_vocab(values, ids, vocab_size):
    return backends.active.to_vocab(values, ids, vocab_size)


def greedy_ids(logits, ids):
    return backends.active.greedy_ids(logits, ids)


__all__ = ["available_backends", "greedy_ids", "subset_logits", "to_vocab", "use_backend"]
