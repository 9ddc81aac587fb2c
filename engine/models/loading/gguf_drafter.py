"""A GGUF draft model's decoder layers re-quantized to Tandem's own int8 / int4 layers.

A drafter's weights never change what the target accepts, only what a draft step costs and how
often the target agrees. On its file's own blocks a GGUF drafter runs through transformers'
modules around kernels.gguf_linear: on the default pair a Q5_0 draft step cost 0.67 of a
target step where the int4 one, in the fused decoder layer (engine.models.runners.fused_runner),
cost 0.33 (engine.models.loading.loader.drafter_weights). So a GGUF drafter held at "int8" / "int4"
("auto" next to a GGUF target) gets the same layers a converted folder's drafter gets:

- one matrix at a time, dequantized exactly as gguf-py does (kernels.gguf_linear.dequantize)
  and quantized by the folder's rule (engine.quant.quantize.quantized_layer): never a 16-bit
  copy of the model, only the fp32 matrix being converted;
- cached like a folder's (engine.quant.weight_cache, keyed by the file's path, size and
  modification time), so later loads read the verified cache and leave the file's layer bytes
  unread;
- the file's pages those layers were read from released afterwards (GgufFile.release_pages):
  resident memory is the converted layers, as the memory fit counts it.

The embedding and the LM head stay the file's: the pruned draft head reads the head's rows
(engine.drafters.gguf_head). A re-quantized drafter is a second rounding of already-rounded
weights; on the default pair's Q5_0 file it agrees with the target about as often as the int4
drafter converted from the original weights (docs/performance.md, "The drafter").
"""
from __future__ import annotations

import logging
import time

import torch
from torch import nn

from engine.core.heap import release_freed_memory
from engine.gguf.modules import DenseLinear, GgufLinear
from engine.gguf.reader import GgufFile
from engine.models.loading.cached_quantization import layers_fit
from engine.quant import weight_cache
from engine.quant.quantize import DamagedWeights, pack_int8_layers, quantized_layer

log = logging.getLogger(__name__)


def requantize_layers(model: nn.Module, file: GgufFile, kind: str) -> bool:
    """Replace the file-backed linear layers of ``model`` (built on ``file``; its LM head left as
    it is) with int8 / int4 ones (``kind``), in place, from the weight cache when it holds them
    (returns True then), else converted from the file and cached."""
    if kind not in ("int8", "int4"):
        raise ValueError(f"a GGUF drafter's layers are re-quantized to int8 or int4, not {kind!r}")
    start = time.perf_counter()
    head = model.get_output_embeddings()
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, (GgufLinear, DenseLinear)) and m is not head]
    shapes = {name: (m.out_features, m.in_features) for name, m in layers}
    cached = weight_cache.load(file.path, kind, role="drafter")
    if cached is not None and not layers_fit(shapes, cached, kind):
        log.warning("%s cache of %s (as a drafter) does not match the model; converting again", kind, file.name)
        cached = None
    held: dict[str, torch.Tensor] = {}
    released = 0
    try:
        for name, module in layers:
            layer, tensors, _ = quantized_layer(name, _stand_in(module, with_weight=cached is None), kind, cached or {})
            held.update(tensors)
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, layer)
            if isinstance(module, GgufLinear):
                released += file.release_pages(module.weight_blocks.raw)
    except DamagedWeights as exc:
        raise DamagedWeights(f"{file.path}: {exc}") from None
    release_freed_memory()  # the fp32 matrices converted from
    from_cache = cached is not None
    if not from_cache:
        try:
            weight_cache.save(file.path, held, kind, role="drafter")
        except OSError as exc:  # read-only or full cache dir: the drafter still runs
            log.warning("could not cache the %s weights of %s (%s)", kind, file.name, exc)
    del held, cached
    if kind == "int8":
        pack_int8_layers(model)
    log.info("%s: %d layers as %s%s in %.1fs, %d MiB of the file's pages released", file.name, len(layers), kind,
             " (cached)" if from_cache else "", time.perf_counter() - start, released >> 20)
    return from_cache


def _stand_in(module: GgufLinear | DenseLinear, with_weight: bool) -> nn.Linear:
    """An nn.Linear of ``module``'s shape and bias for the quantizer: its weight the module's
    matrix as fp32 (outputs in the model's order) when it is to be quantized, else left on the
    meta device (a cache's layers are taken as they are; the weight is never read)."""
    linear = nn.Linear(module.in_features, module.out_features, bias=False, device="meta")
    if with_weight:
        rows = torch.arange(module.out_features)
        linear.weight = nn.Parameter(module.dense_rows(rows), requires_grad=False)
    if module.bias is not None:
        linear.bias = nn.Parameter(module.bias, requires_grad=False)
    return linear

