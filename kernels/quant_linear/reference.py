"""Specification: int8 weight-only linear with one scale per output row.

Quantization (symmetric, round to nearest even):
    scale[n] = max_k |W[n, k]| / 127        (1 where the row is all zeros)
    q[n, k]  = round(W[n, k] / scale[n])      in [-127, 127]
Linear:
    y = round_to_x_dtype(fp32(x) @ (fp32(q) * scale[:, None])^T + fp32(b))

x: [..., K] (bf16 or fp32), q: [N, K] int8, scale: [N] fp32, bias: [N] or None. Only drafters
use it: their precision changes what they propose, never what the target accepts.
"""
from __future__ import annotations

import torch


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] (any float dtype) -> (q [N, K] int8, scale [N] fp32)."""
    w = weight.float()
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[:, None]


def linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = x.float() @ dequantize(q, scale).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
