"""Verification of a block of draft tokens against the target (speculative decoding's core).

Backends (one module each, all parity-tested against ``reference``, which is the spec):

    reference     pure torch, any device; a few host syncs per call
    mps           vectorised torch ops, any device, one host sync (chosen on Apple MPS)
    triton        two Triton kernels per rule, one host sync (chosen on CUDA when triton is
                  installed: ``pip install tandem[gpu]``); also runs under TRITON_INTERPRET=1

The backend is chosen once at import: CUDA + triton -> triton, MPS -> mps, else reference.
``TANDEM_VERIFY_BACKEND=<name>`` or ``use_backend(name)`` overrides the choice (tests, benches).
Every backend draws its random numbers with ``reference.draw_randomness``, so given the same
generator state all of them return the same verdict.
"""
from __future__ import annotations

import logging
import os

import torch

from kernels.verify import mps, reference
from kernels.verify.reference import Randomness, Verdict, draw_randomness

log = logging.getLogger(__name__)

# The mps backend is plain torch: registered everywhere so that its parity tests run on CPU.
_BACKENDS = {"reference": reference, "mps": mps}


def _triton_wanted() -> bool:
    # Triton compiles for CUDA; without a GPU it is only useful under its interpreter.
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def _register_triton() -> None:
    if not _triton_wanted():
        return
    try:
        from kernels.verify import triton_cuda
    except ImportError as exc:  # triton not installed: the other backends still work
        log.info("triton verify backend unavailable (%s)", exc)
        return
    _BACKENDS["triton"] = triton_cuda


def _default_backend() -> str:
    chosen = os.environ.get("TANDEM_VERIFY_BACKEND")
    if chosen in _BACKENDS:
        return chosen
    if chosen:
        log.warning("TANDEM_VERIFY_BACKEND=%s is not available here (%s); choosing automatically",
                    chosen, ", ".join(sorted(_BACKENDS)))
    if torch.cuda.is_available() and "triton" in _BACKENDS:
        return "triton"
    mps_backend = getattr(torch.backends, "mps", None)
    if mps_backend is not None and mps_backend.is_available():
        return "mps"
    return "reference"


_register_triton()
_active = reference


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def active_backend() -> str:
    return next(name for name, module in _BACKENDS.items() if module is _active)


def use_backend(name: str) -> None:
    global _active
    if name not in _BACKENDS:
        raise ValueError(f"unknown verify backend {name!r}; available: {available_backends()}")
    _active = _BACKENDS[name]


use_backend(_default_backend())
log.debug("verify backend: %s", active_backend())


def verify_greedy(draft_tokens, target_logits) -> Verdict:
    """draft_tokens: [k] long; target_logits: [k+1, V] -> Verdict (see reference.py)."""
    return _active.verify_greedy(draft_tokens, target_logits)


def verify_sampled(draft_tokens, draft_probs, target_probs, generator) -> Verdict:
    """draft_tokens: [k]; draft_probs: [k, V] q or None; target_probs: [k+1, V] p -> Verdict."""
    return _active.verify_sampled(draft_tokens, draft_probs, target_probs, generator)


def sampled_verdict(draft_tokens, draft_probs, target_probs, randomness: Randomness) -> Verdict:
    """verify_sampled with its random numbers given (``draw_randomness``)."""
    return _active.sampled_verdict(draft_tokens, draft_probs, target_probs, randomness)


__all__ = [
    "Randomness", "Verdict", "active_backend", "available_backends", "draw_randomness",
    "sampled_verdict", "use_backend", "verify_greedy", "verify_sampled",
]
