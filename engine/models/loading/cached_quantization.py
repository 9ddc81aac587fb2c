"""Quantizing a loaded model's linear layers to int8 / int4 through the weight cache.

The first load at a precision quantizes (engine.quant.quantize) and writes the result to
engine.quant.weight_cache; later loads take the verified file as it is. Targets and draft
models both go through here: a drafter's layers are quantized by the same rules, so caching
them is as sound as caching a target's, and its load (the default pair's int4 drafter next to
a GGUF target, at every start) pays the conversion once. The two roles keep
separate files: a target's holds its LM head, a drafter's does not (its reduced head quantizes
the rows it keeps at every load).
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from engine.quant import weight_cache
from engine.quant.quantize import (
    DamagedWeights,
    pack_int8_layers,
    quantize_drafter,
    to_int4_target,
    to_int8_target,
)
from kernels.int4_linear.reference import supports as int4_supports

log = logging.getLogger(__name__)


def quantize_through_cache(model: torch.nn.Module, path: Path, kind: str, role: str = "target") -> bool:
    """Quantize ``model`` (loaded from the folder ``path``) in place to ``kind`` ("int8",
    "int4") for ``role`` ("target": LM head included; "drafter": without it), from the cache
    when it holds this model's layers (returns True then), else from its weights, caching the
    result. A cache that is damaged is removed by weight_cache.load, one that holds other
    layers is overwritten; either way the model is quantized again."""
    cached = weight_cache.load(path, kind, role=role)
    if cached is not None and not cache_fits(model, cached, kind, include_head=role == "target"):
        log.warning("%s cache of %s (as a %s) does not match the model; converting again", kind, path.name, role)
        cached = None
    try:
        if role == "target":
            held = (to_int8_target if kind == "int8" else to_int4_target)(model, cached)
        else:
            held = quantize_drafter(model, kind, cached)
    except DamagedWeights as exc:
        raise DamagedWeights(f"{path}: {exc}") from None
    from_cache = cached is not None
    if not from_cache:
        try:
            weight_cache.save(path, held, kind, role=role)
        except OSError as exc:  # read-only or full cache dir: the model still runs
            log.warning("could not cache the %s weights of %s (%s)", kind, path.name, exc)
    del held, cached  # the row layout the cache holds: packing below replaces it
    if role == "drafter" and kind == "int8":
        pack_int8_layers(model)
    return from_cache


def cache_fits(model: torch.nn.Module, cached: dict[str, torch.Tensor], kind: str = "int8",
               include_head: bool = True) -> bool:
    """Whether ``cached`` holds exactly the quantized layers ``model`` needs: every linear
    layer (but the LM head unless ``include_head``) at its shape, and nothing else."""
    head = None if include_head else model.get_output_embeddings()
    shapes = {name: tuple(m.weight.shape) for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and m is not head}
    return layers_fit(shapes, cached, kind)


def layers_fit(shapes: dict[str, tuple[int, int]], cached: dict[str, torch.Tensor], kind: str = "int8") -> bool:
    """Whether ``cached`` holds exactly the quantized layers of these names and [N, K] shapes."""

    def held(name: str, shape: tuple[int, int]) -> bool:
        if kind == "int4" and f"{name}.packed" in cached:
            n, k = shape
            return cached[f"{name}.packed"].shape == (n // 4, k // 32, 4, 16) and f"{name}.offset" in cached
        return f"{name}.q" in cached and tuple(cached[f"{name}.q"].shape) == shape and cached[f"{name}.q"].dtype == torch.int8

    expected = sum(3 if kind == "int4" and int4_supports(*shape) else 2 for shape in shapes.values())
    return len(cached) == expected and all(held(name, shape) for name, shape in shapes.items())
