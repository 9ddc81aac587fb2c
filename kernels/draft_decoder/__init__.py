"""A whole int8 decoder layer of a drafter in one call (see reference.py for the contract).

Why: once a drafter's weights are int8, the dispatch of ~50 small PyTorch ops per layer is a
sizeable part of a draft step; one call per layer removes it. The backend is chosen once, on
first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

import logging
import os

from kernels.draft_decoder import reference

log = logging.getLogger(__name__)

_BACKENDS = {"reference": reference}
_active = None


def available_backends() -> list[str]:
    if len(_BACKENDS) == 1 and not os.environ.get("TANDEM_NO_CPU_KERNELS"):
        try:
            from kernels.draft_decoder import cpu_avx2

            if cpu_avx2.available():
                _BACKENDS["cpu_avx2"] = cpu_avx2
        except Exception as exc:  # no compiler, unsupported CPU: the reference still works
            log.warning("fast drafter decoder kernel unavailable (%s)", exc)
    return sorted(_BACKENDS)


def fast_backend():
    global _active
    if _active is None:
        available_backends()
        _active = _BACKENDS.get("cpu_avx2", reference)
    return None if _active is reference else _active


def use_backend(name: str) -> None:
    global _active
    available_backends()
    if name not in _BACKENDS:
        raise ValueError(f"unknown draft_decoder backend {name!r}; available: {sorted(_BACKENDS)}")
    _active = _BACKENDS[name]


def decoder_layer(*args) -> None:
    if _active is None:
        fast_backend()
    _active.decoder_layer(*args)


__all__ = ["available_backends", "decoder_layer", "fast_backend", "use_backend"]
