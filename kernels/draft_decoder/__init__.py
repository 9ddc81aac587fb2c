"""A whole int8 decoder layer of a drafter in one call (see reference.py for the contract).

Why: once a drafter's weights are int8, the dispatch of ~50 small PyTorch ops per layer is a
sizeable part of a draft step; one call per layer removes it. The backend is chosen once, on
first use; ``use_backend(name)`` overrides it (tests).
"""
from __future__ import annotations

from kernels.backends import CpuBackends
from kernels.draft_decoder import reference

backends = CpuBackends("draft_decoder", reference, "drafter decoder")


def available_backends() -> list[str]:
    return backends.available()


def fast_backend():
    return backends.fast()


def use_backend(name: str) -> None:
    backends.use(name)


def backend_detail() -> str:
    """The tiles int8 targets' layers run (kernels.quant_linear.tile_set_detail)."""
    from kernels.draft_decoder import cpu_avx2
    from kernels.quant_linear import tile_set_detail

    return tile_set_detail(backends.active_name(), cpu_avx2.a16_isa)


def decoder_layer(*args) -> None:
    backends.active.decoder_layer(*args)


__all__ = ["available_backends", "decoder_layer", "fast_backend", "use_backend"]
