"""A model's linear layers as 4-bit weights on CUDA or Apple MPS (kernels/int4pack), converted
at load time; the precision "int4" off the CPU.

Why: at 16 bits an 8 GB GPU or a 16 GB Mac holds a ~3-4B model; at 5 bits a weight (group-32
affine 4-bit with bf16 / fp16 scale and zero per 32) an 8B-class one fits, and each decode
step reads ~3x fewer bytes.

What becomes what (``to_4bit_device_weights``):

    decoder linears    Int4PackLinear (torch's int4 kernel), from the model's 16-bit weights
                       (quantized to group-32 affine) or from codes given per layer (a GGUF
                       file's Q4_0 / Q4_1 / Q4_K sub-blocks, already in that form)
    ``keep_8bit``      Int8PackLinear (one scale per output row): layers a file holds at more
                       than 4 bits (Q5_*, Q6_K, Q8_0), which 4 bits would round further
    LM head            Int8PackLinear (``tables="int8"``, targets; llama.cpp's Q4_K_M keeps its
                       output at 6 bits too), or as loaded (``tables="keep"``, drafters, whose
                       reduced heads read the head's rows)
    input embedding    Int8Embedding (targets; one int8 row and its scale per token; a tied
                       embedding shares the head's int8 table), or as loaded (drafters)
    other shapes       as loaded: torch's kernels need N in 8s and K in 32s (never padded)

Lossy, chosen by the user: the model's output changes. Greedy speculation on the converted
target equals its own plain decoding where its kernels are batch-invariant: torch's CPU int4 /
int8 kernels are (tested row by row); on a GPU the kernels' per-row result may depend on the
row count (tile choices), which torch does not promise either way: scripts/gpu_check.sh
measures it there.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from kernels import int4pack
from kernels.int4pack import AffineInt4, Int4Packed

log = logging.getLogger(__name__)

Tables = Literal["int8", "keep"]


class Int4PackLinear(torch.nn.Module):
    """Drop-in for nn.Linear holding torch's packed int4 codes and its [K/32, N, 2] scales and
    zeros. The packing is per device: the layer runs on the device it was packed for."""

    def __init__(self, packed: Int4Packed, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = packed.in_features, packed.out_features
        self.packed_for = packed.weight.device.type
        self.register_buffer("weight_packed", packed.weight)
        self.register_buffer("scales_zeros", packed.scales_zeros)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().to(packed.dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_packed.device.type != self.packed_for:
            raise RuntimeError(f"int4 weights packed for {self.packed_for} cannot run on {self.weight_packed.device.type}: "
                               "convert the model on the device it runs on")
        packed = Int4Packed(self.weight_packed, self.scales_zeros, self.out_features, self.in_features)
        return int4pack.linear(x, packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 group 32 ({self.packed_for})"


class Int8PackLinear(torch.nn.Module):
    """Drop-in for nn.Linear holding int8 weights and one scale per output row (in the
    activations' dtype, as aten._weight_int8pack_mm wants)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().to(scale.dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int4pack.linear_int8(x, self.q, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row"


class Int8Embedding(torch.nn.Module):
    """An input embedding held as int8 rows with one scale each: a lookup reads one row and
    dequantizes it. ``embed_scale`` (Gemma's scaled embeddings) multiplies the rows, as there."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, padding_idx: int | None, embed_scale=None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = q.shape
        self.padding_idx = padding_idx
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        if isinstance(embed_scale, torch.Tensor):  # a buffer, so that it moves with the model
            self.register_buffer("embed_scale", embed_scale.detach().clone(), persistent=False)
        else:
            self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = torch.nn.functional.embedding(input_ids, self.q).to(self.scale.dtype)
        rows = rows * torch.nn.functional.embedding(input_ids, self.scale[:, None])
        if self.embed_scale is not None:
            rows = rows * (self.embed_scale.to(rows.dtype) if isinstance(self.embed_scale, torch.Tensor) else self.embed_scale)
        return rows

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 per row"


@dataclass(frozen=True)
class DeviceWeights:
    """What ``to_4bit_device_weights`` made, with the bytes its tensors hold (the memory fit's
    figures are checked against these)."""

    device: str
    dtype: str
    int4_layers: int
    int8_layers: int
    kept_layers: tuple[str, ...]
    int4_weights: int  # weights held at 4 bits
    int4_bytes: int    # their codes, scales and zeros
    int8_bytes: int    # int8 layers (head included) and the int8 embedding
    seconds: float

    @property
    def int4_bits_per_weight(self) -> float:
        return 8 * self.int4_bytes / self.int4_weights if self.int4_weights else 0.0


def _parent(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


# Rows quantized at a time: each row's result is its own, and a chunk bounds the fp32 copy the
# quantizer makes on the device (a 128256 x 4096 head whole would be 2.1 GB on an 8 GB GPU).
_CHUNK_ROWS = 4096


def _quantize_int8(weight: torch.Tensor, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [int4pack.quantize_int8(rows.to(device), dtype) for rows in weight.detach().split(_CHUNK_ROWS)]
    return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])


def _quantize_int4(weight: torch.Tensor, device, dtype) -> AffineInt4:
    parts = [int4pack.quantize(rows.to(device), dtype) for rows in weight.detach().split(_CHUNK_ROWS)]
    return AffineInt4(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scale", "offset")))


def _int8_layer(weight: torch.Tensor, bias, device, dtype) -> Int8PackLinear:
    q, scale = _quantize_int8(weight, device, dtype)
    return Int8PackLinear(q, scale, None if bias is None else bias.to(device))


def _int4_layer(module: torch.nn.Linear, given: AffineInt4 | None, device, dtype) -> Int4PackLinear:
    if given is not None:
        if tuple(given.codes.shape) != tuple(module.weight.shape):
            raise ValueError(f"given int4 codes {tuple(given.codes.shape)} do not match the layer {tuple(module.weight.shape)}")
        weights = given
    else:
        weights = _quantize_int4(module.weight, device, dtype)
    bias = None if module.bias is None else module.bias.to(device)
    return Int4PackLinear(int4pack.pack(weights, device, dtype), bias)


def _same_table(a: torch.nn.Module | None, b: torch.nn.Module | None) -> bool:
    wa, wb = getattr(a, "weight", None), getattr(b, "weight", None)
    return isinstance(wa, torch.Tensor) and isinstance(wb, torch.Tensor) and wa.data_ptr() == wb.data_ptr()


def to_4bit_device_weights(model: torch.nn.Module, device: torch.device | str, *,
                           given: Mapping[str, AffineInt4] | None = None, keep_8bit: Collection[str] = (),
                           tables: Tables = "int8", dtype: torch.dtype | None = None) -> DeviceWeights:
    """Convert ``model``'s linear layers in place (see the module docstring) and move the model
    to ``device``. ``given``: {layer name: codes, scale, offset} to use instead of quantizing
    that layer's weights; ``keep_8bit``: layer names held at 8 bits; ``dtype``: the scales' and
    activations' dtype (default: what torch's kernel reads on ``device``); the model's other
    floating parameters are cast to it too (buffers such as rotary frequencies are left as
    transformers keeps them). Layer by layer, so a model loaded on the CPU (memory-mapped, in
    its stored dtype) never needs a 16-bit copy of itself on the device or a converted one on
    the host."""
    start = time.perf_counter()
    device = torch.device(device)
    reason = int4pack.unsupported_reason(device)
    if reason is not None:
        raise ValueError(f"4-bit weights cannot run here: {reason}")
    dtype = dtype or int4pack.device_dtype(device)
    given = dict(given or {})
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = _same_table(head, embed)
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    unknown = set(given) - {name for name, _ in linears}
    if unknown:
        raise ValueError(f"codes given for layers the model does not have: {', '.join(sorted(unknown))}")
    int4_count = int8_count = int4_weights = int4_bytes = int8_bytes = 0
    kept = []
    head_int8: Int8PackLinear | None = None
    for name, module in linears:
        n, k = module.weight.shape
        is_head = module is head
        layer: torch.nn.Module | None = None
        if name in given or (not is_head and name not in keep_8bit and int4pack.supports(n, k)):
            layer = _int4_layer(module, given.get(name), device, dtype)
            int4_count, int4_weights = int4_count + 1, int4_weights + n * k
            int4_bytes += layer.weight_packed.nbytes + layer.scales_zeros.nbytes
        elif (name in keep_8bit or (is_head and tables == "int8")) and int4pack.int8_supports(n, k, device):
            layer = _int8_layer(module.weight.detach(), module.bias, device, dtype)
            int8_count += 1
            int8_bytes += layer.q.nbytes + layer.scale.nbytes
            head_int8 = layer if is_head else head_int8
        else:
            kept.append(name)
        if layer is not None:
            parent, attr = _parent(model, name)
            setattr(parent, attr, layer)
    if tables == "int8" and embed is not None and (type(embed) is torch.nn.Embedding or hasattr(embed, "embed_scale")):
        if tied and head_int8 is not None:  # one int8 table serves the lookup and the head
            q, scale = head_int8.q, head_int8.scale
        else:
            q, scale = _quantize_int8(embed.weight, device, dtype)
            int8_bytes += q.nbytes + scale.nbytes
        model.set_input_embeddings(Int8Embedding(q, scale, embed.padding_idx, getattr(embed, "embed_scale", None)))
    for param in model.parameters():  # norms, biases, layers kept as loaded
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
    model.to(device)
    seconds = time.perf_counter() - start
    log.info("4-bit on %s: %d int4 layers (%.2f bits a weight), %d int8, %d kept as loaded, in %.1fs", device,
             int4_count, 8 * int4_bytes / max(1, int4_weights), int8_count, len(kept), seconds)
    return DeviceWeights(str(device), str(dtype).removeprefix("torch."), int4_count, int8_count, tuple(kept),
                         int4_weights, int4_bytes, int8_bytes, seconds)
