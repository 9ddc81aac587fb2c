"""A lighter drafter: its linear layers as int8 weights (kernels.quant_linear), at load time.

Only for drafters. A draft step reads every weight once and is bound by memory bandwidth on a
CPU, so int8 weights (half the bytes of bf16, a quarter of fp32) make it about twice as cheap;
what the drafter proposes changes slightly, what the target accepts does not. The LM head is
left alone: the drafter's own (reduced) head quantizes just the rows it keeps, and the full head
stays available to anything else that runs the model (transformers' assisted generation).
"""
from __future__ import annotations

import logging
import time
import types

import torch

from kernels import linear as linear_kernels
from kernels import quant_linear

log = logging.getLogger(__name__)


class Int8Linear(torch.nn.Module):
    """Drop-in for nn.Linear holding int8 weights and one fp32 scale per output feature."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        q, scale = quant_linear.quantize(linear.weight.detach())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_linear.linear(x, self.q, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def int8_available() -> bool:
    """Quantizing pays only where a fast int8 kernel runs (the reference dequantizes per call)."""
    return quant_linear.fast_backend() is not None


def quantize_linears(model: torch.nn.Module) -> int:
    """Replace every nn.Linear of ``model`` but its output embeddings with an Int8Linear, in
    place; the float weights are released. Returns how many were replaced."""
    start = time.perf_counter()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    ]
    for name, module in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, Int8Linear(module))
    log.info("int8 drafter: %d linear layers in %.1fs", len(targets), time.perf_counter() - start)
    return len(targets)


def _fp32_out_embedding(self, input_ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.embedding(input_ids, self.weight, self.padding_idx).float()


def _head_any_input(self, x: torch.Tensor) -> torch.Tensor:
    if self.weight.dtype == torch.bfloat16 and linear_kernels.fast_backend() is not None:
        return linear_kernels.linear(x, self.weight, self.bias)  # fp32 x, bf16 rows: no copy
    return torch.nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias).float()


def to_int8_drafter(model: torch.nn.Module) -> torch.nn.Module:
    """Turn a loaded (bf16 or fp32) drafter into an int8-weight one computing in fp32, in place.

    Linear layers become Int8Linear; everything else that is small (norms, biases) becomes fp32,
    and the embedding lookup returns fp32 rows, so activations stay fp32 from the first layer:
    the int8 kernel reads fp32 activations natively, and on CPUs without native bf16 PyTorch's
    fp32 attention is several times faster than its bf16 one at one query row. The embedding
    tables stay as they are (a lookup reads one row; an fp32 copy would only cost memory)."""
    quantize_linears(model)
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    keep = {id(embed.weight)} | ({id(head.weight)} if head is not None else set())
    for param in model.parameters():
        if id(param) not in keep and param.is_floating_point():
            param.data = param.data.float()
    embed.forward = types.MethodType(_fp32_out_embedding, embed)
    if head is not None:
        head.forward = types.MethodType(_head_any_input, head)
    return model
