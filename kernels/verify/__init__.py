"""Verification of a block of draft tokens against the target (speculative decoding's core).

The backend is chosen once at import. Only the pure-torch reference exists on CPU; GPU backends
register themselves here when present. ``use_backend(name)`` overrides the choice (tests).
"""
from __future__ import annotations

from kernels.verify import reference
from kernels.verify.reference import Verdict

_BACKENDS = {"reference": reference}
_active = reference


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def use_backend(name: str) -> None:
    global _active
    if name not in _BACKENDS:
        raise ValueError(f"unknown verify backend {name!r}; available: {available_backends()}")
    _active = _BACKENDS[name]


def verify_greedy(draft_tokens, target_logits) -> Verdict:
    return _active.verify_greedy(draft_tokens, target_logits)


def verify_sampled(draft_tokens, draft_probs, target_probs, generator) -> Verdict:
    return _active.verify_sampled(draft_tokens, draft_probs, target_probs, generator)


__all__ = ["Verdict", "available_backends", "use_backend", "verify_greedy", "verify_sampled"]
