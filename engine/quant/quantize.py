"""Models with int8 linear weights (kernels.quant_linear), converted at load time.

A decode step reads every weight once and is bound by memory bandwidth on a CPU, so int8
weights (half the bytes of bf16, a quarter of fp32) make it about twice as cheap.

Drafters (``to_int8_drafter``): what the drafter proposes changes slightly, what the target
accepts does not. Their LM head is left alone: the drafter's own (reduced) head quantizes just
the rows it keeps, and the full head stays available to anything else that runs the model
(transformers' assisted generation).

Targets (``to_int8_target``, precision "int8"): the one lossy step, chosen by the user; the
target's output changes slightly. The LM head is quantized too (a sixth of the 1.5B target's
bytes). The int8 kernel computes every output row with the same instructions whatever the
number of rows, so verification stays batch-invariant and greedy speculation on the int8
target is token-identical to plain decoding of that same int8 target.
"""
from __future__ import annotations

import logging
import time
import types

import torch

from engine.core.heap import release_freed_memory
from kernels import int4_linear, quant_linear
from kernels import linear as linear_kernels
from kernels.linear.packing import can_pack, pack

log = logging.getLogger(__name__)


class DamagedWeights(RuntimeError):
    """A model's weights hold NaN or infinite values: its files are damaged."""


def refuse_non_finite(name: str, weight: torch.Tensor) -> None:
    """Quantizing would hide a NaN (it rounds to an arbitrary int8), and the damaged model would
    then decode plausible garbage: refuse the weight instead, naming it."""
    if not torch.isfinite(weight).all():
        raise DamagedWeights(f"the weights of {name} hold NaN or infinite values: the model's files are damaged;"
                             f" convert or download it again")


class Int8Linear(torch.nn.Module):
    """Drop-in for nn.Linear holding int8 weights and one fp32 scale per output feature."""

    def __init__(self, linear: torch.nn.Linear, quantized: tuple[torch.Tensor, torch.Tensor] | None = None,
                 int16_inputs: bool = False) -> None:
        """``quantized``: (q, scale) already computed from ``linear``'s weight (a cache).
        ``int16_inputs``: quantize the inputs to int16 per 256 values and multiply in integers
        (kernels/quant_linear ``linear_a16``): int8 targets, whose verification of a few rows it
        makes ~15% cheaper per layer. Drafters keep fp32 inputs and may pack their weights."""
        super().__init__()
        self.int16_inputs = int16_inputs
        q, scale = quantized if quantized is not None else quant_linear.quantize(linear.weight.detach())
        if q.shape != linear.weight.shape or scale.shape != (linear.out_features,):
            raise ValueError(f"quantized weights {tuple(q.shape)} do not match the layer {tuple(linear.weight.shape)}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.int16_inputs:
            return quant_linear.linear_a16(x, self.q, self.scale, self.bias)
        return quant_linear.linear(x, self.q, self.scale, self.bias)

    def pack(self) -> bool:
        """Rearrange the weights into panels of 8 rows (kernels/linear/packing.py), which one-row
        drafting reads faster. Same values, same memory. Not for targets: the int8 cache and the
        batch-invariance contract are stated for the row layout. True when packed."""
        if self.q.dim() == 3 or self.int16_inputs or not can_pack(self.q):
            return False
        self.q = pack(self.q)
        return True

    def extra_repr(self) -> str:
        inputs = ", int16 inputs" if self.int16_inputs else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8{inputs}"


class Int4Linear(torch.nn.Module):
    """Drop-in for nn.Linear holding int4 weights (kernels/int4_linear: a scale and an offset
    per 32 weights, rows in panels of 4); its inputs are quantized to int8 per 32 values inside
    the kernel. Only for shapes ``int4_linear.reference.supports`` (others stay int8)."""

    def __init__(self, linear: torch.nn.Linear,
                 quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
        super().__init__()
        packed, scale, offset = quantized if quantized is not None else int4_linear.quantize(linear.weight.detach())
        n, k = linear.out_features, linear.in_features
        if packed.shape != (n // 4, k // 32, 4, 16) or offset.shape != (n, k // 32):
            raise ValueError(f"int4 weights {tuple(packed.shape)} do not match the layer {tuple(linear.weight.shape)}")
        self.in_features, self.out_features = k, n
        self.register_buffer("packed", packed)
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int4_linear.linear(x, self.packed, self.scale, self.offset, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4"


def int4_available() -> bool:
    return int4_linear.fast_backend() is not None


def int8_available() -> bool:
    """Quantizing pays only where a fast int8 kernel runs (the reference dequantizes per call)."""
    return quant_linear.fast_backend() is not None


# Trim the heap after every few converted layers: each trim walks the heap (~8 ms), and a few
# layers' temporaries are tens of MB.
TRIM_EVERY = 8


def quantize_linears(model: torch.nn.Module, include_head: bool = False,
                     quantized: dict[str, torch.Tensor] | None = None, int16_inputs: bool = False) -> dict[str, torch.Tensor]:
    """Replace every nn.Linear of ``model`` (but its output embeddings unless ``include_head``)
    with an Int8Linear, in place; the float weights are released. ``quantized`` holds
    ``{name}.q`` / ``{name}.scale`` computed earlier (a cache); layers found there are not
    quantized again. Returns the int8 weights and scales of every replaced layer, by those keys."""
    start = time.perf_counter()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and (include_head or module is not head)
    ]
    quantized = quantized or {}
    held = {}
    for index, (name, module) in enumerate(targets):
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        device = module.weight.device  # a cache is read to the CPU; the model may be elsewhere
        cached = ((quantized[f"{name}.q"].to(device), quantized[f"{name}.scale"].to(device))
                  if f"{name}.q" in quantized else None)
        if cached is None:
            refuse_non_finite(name, module.weight)
        layer = Int8Linear(module, cached, int16_inputs=int16_inputs)
        setattr(parent, attr, layer)
        held[f"{name}.q"], held[f"{name}.scale"] = layer.q, layer.scale
        if cached is None and index % TRIM_EVERY == TRIM_EVERY - 1:
            release_freed_memory()  # the layers' fp32 temporaries (engine.core.heap)
    log.info("int8: %d linear layers in %.1fs", len(targets), time.perf_counter() - start)
    return held


def _fp32_out_embedding(self, input_ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.embedding(input_ids, self.weight, self.padding_idx).float()


def _head_any_input(self, x: torch.Tensor) -> torch.Tensor:
    if self.weight.dtype == torch.bfloat16 and linear_kernels.fast_backend() is not None:
        return linear_kernels.linear(x, self.weight, self.bias)  # fp32 x, bf16 rows: no copy
    return torch.nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias).float()


def _fp32_activations(model: torch.nn.Module, keep: set[int]) -> None:
    """Small float parameters (norms, biases) to fp32 and fp32 rows out of the embedding, so
    activations are fp32 from the first layer on (see to_int8_drafter)."""
    for param in model.parameters():
        if id(param) not in keep and param.is_floating_point():
            param.data = param.data.float()
    embed = model.get_input_embeddings()
    embed.forward = types.MethodType(_fp32_out_embedding, embed)


def to_int8_target(model: torch.nn.Module, quantized: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Turn a loaded bf16 target into an int8-weight one computing in fp32, in place: every
    linear layer, the LM head included, becomes an Int8Linear on int16-quantized inputs; the
    embedding table stays as loaded (bf16, memory-mapped: a lookup reads one row).
    ``quantized``: int8 weights from an earlier conversion (engine.quant.weight_cache). Returns the int8
    weights, to cache."""
    held = quantize_linears(model, include_head=True, quantized=quantized, int16_inputs=True)
    _fp32_activations(model, {id(model.get_input_embeddings().weight)})
    return held


def quantize_linears_int4(model: torch.nn.Module, quantized: dict[str, torch.Tensor] | None = None,
                          include_head: bool = True) -> dict[str, torch.Tensor]:
    """Replace every nn.Linear of ``model`` (the LM head too unless not ``include_head``) with
    an Int4Linear, or an Int8Linear where int4 cannot hold its shape, in place. ``quantized``:
    ``{name}.packed`` / ``.scale`` / ``.offset`` (int4) or ``{name}.q`` / ``.scale`` (int8) from
    a cache. Returns the quantized tensors of every replaced layer, by those keys."""
    start = time.perf_counter()
    quantized = quantized or {}
    held = {}
    head = None if include_head or not hasattr(model, "get_output_embeddings") else model.get_output_embeddings()
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    for index, (name, module) in enumerate(targets):
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer, tensors, from_cache = quantized_layer(name, module, "int4", quantized)
        held.update(tensors)
        setattr(parent, attr, layer)
        if not from_cache and index % TRIM_EVERY == TRIM_EVERY - 1:
            release_freed_memory()  # the layers' fp32 temporaries (engine.core.heap)
    log.info("int4: %d linear layers in %.1fs", len(targets), time.perf_counter() - start)
    return held


def quantized_layer(name: str, linear: torch.nn.Linear, kind: str,
                    quantized: dict[str, torch.Tensor]) -> tuple[torch.nn.Module, dict[str, torch.Tensor], bool]:
    """``linear`` (the layer called ``name``) as an Int8Linear, or for ``kind`` "int4" an
    Int4Linear where int4 holds its shape (else int8); taken from ``quantized`` (a cache, by the
    keys it holds) when that has it, when ``linear``'s weight is never read. Returns the layer,
    the tensors a cache keeps for it, and whether they came from ``quantized``."""
    if kind == "int4" and int4_linear.reference.supports(linear.out_features, linear.in_features):
        from_cache = f"{name}.packed" in quantized
        if not from_cache:
            refuse_non_finite(name, linear.weight)
        layer = Int4Linear(linear, tuple(quantized[f"{name}.{k}"] for k in ("packed", "scale", "offset")) if from_cache else None)
        return layer, {f"{name}.packed": layer.packed, f"{name}.scale": layer.scale, f"{name}.offset": layer.offset}, from_cache
    from_cache = f"{name}.q" in quantized
    if not from_cache:
        refuse_non_finite(name, linear.weight)
    layer = Int8Linear(linear, (quantized[f"{name}.q"], quantized[f"{name}.scale"]) if from_cache else None)
    return layer, {f"{name}.q": layer.q, f"{name}.scale": layer.scale}, from_cache


def to_int4_target(model: torch.nn.Module, quantized: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """As to_int8_target with int4 weights (precision "int4"): a quarter of bf16's bytes plus a
    scale and offset per 32 weights, and inputs quantized to int8 per 32 values in each layer
    (llama.cpp's Q4_1 x Q8_1 recipe). Lossy, chosen by the user; speculation on it stays
    token-identical to plain decoding of the same int4 target (the kernel is batch-invariant)."""
    held = quantize_linears_int4(model, quantized)
    _fp32_activations(model, {id(model.get_input_embeddings().weight)})
    return held


def to_int4_drafter(model: torch.nn.Module) -> torch.nn.Module:
    """As to_int8_drafter with int4 decoder layers (Int4Linear where the shape allows, else
    Int8Linear); the LM head is left for the drafter's reduced head, as there. A drafter's
    precision changes what it proposes, never what the target accepts."""
    quantize_drafter(model, "int4")
    return model


def to_int8_drafter(model: torch.nn.Module) -> torch.nn.Module:
    """Turn a loaded (bf16 or fp32) drafter into an int8-weight one computing in fp32, in place.

    Linear layers become Int8Linear; everything else that is small (norms, biases) becomes fp32,
    and the embedding lookup returns fp32 rows, so activations stay fp32 from the first layer:
    the int8 kernel reads fp32 activations natively, and on CPUs without native bf16 PyTorch's
    fp32 attention is several times faster than its bf16 one at one query row. The embedding
    tables stay as they are (a lookup reads one row; an fp32 copy would only cost memory)."""
    quantize_drafter(model, "int8")
    pack_int8_layers(model)
    return model


def quantize_drafter(model: torch.nn.Module, kind: str, quantized: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """What to_int8_drafter / to_int4_drafter do (``kind`` "int8" / "int4"), taking the layers
    ``quantized`` holds (an earlier conversion: engine.quant.weight_cache) as they are, and
    leaving int8 layers in row layout; returns every replaced layer's tensors, by the keys a
    cache holds. The LM head is not quantized (the drafter's reduced head reads its rows).
    Pack int8 layers afterwards with ``pack_int8_layers``, once nothing holds the row layout."""
    if kind not in ("int8", "int4"):
        raise ValueError(f"a drafter's weights are quantized to int8 or int4, not {kind!r}")
    if kind == "int8":
        held = quantize_linears(model, quantized=quantized)
    else:
        held = quantize_linears_int4(model, quantized, include_head=False)
    _drafter_fp32_around_tables(model)
    return held


def pack_int8_layers(model: torch.nn.Module) -> None:
    """Pack an int8 drafter's layers for one-row drafting (Int8Linear.pack), where the fast int8
    kernel reads that layout."""
    if int8_available():
        for module in model.modules():
            if isinstance(module, Int8Linear):
                module.pack()


def _drafter_fp32_around_tables(model: torch.nn.Module) -> torch.nn.Module:
    """A quantized drafter's small parameters to fp32, its embedding and head tables left as
    loaded, and the head taking fp32 rows (see to_int8_drafter)."""
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    keep = {id(embed.weight)} | ({id(head.weight)} if head is not None else set())
    _fp32_activations(model, keep)
    if head is not None:
        head.forward = types.MethodType(_head_any_input, head)
    return model
