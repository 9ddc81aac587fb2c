"""A whole int8 decoder layer of a drafter in one call (see reference.py for the contract).

Why: once a drafter's weights are int8, the dispatch of ~50 small PyTorch ops per layer is a
sizeable part of a draft step; one call per layer removes it. The backend is chosen once, on
first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

from kernels.backends import CpuBackends, package_api
from kernels.draft_decoder import reference

# isa: the tiles int8 targets' layers (int16 inputs) run, for kernel reports.
backends = CpuBackends("draft_decoder", reference, "drafter decoder", isa="a16_isa")
available_backends, active_backend, fast_backend, use_backend = package_api(__name__)


def decoder_layer(*args) -> None:
    backends.active.decoder_layer(*args)


__all__ = ["active_backend", "available_backends", "decoder_layer", "fast_backend", "use_backend"]
