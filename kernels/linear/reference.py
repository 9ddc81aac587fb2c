"""Specification: y = round_bf16(fp32(x) @ fp32(W)^T + fp32(b)).

x: [..., K] (bf16 or fp32), weight: [N, K] bf16, bias: [N] or None. Products and sums in
float32, one rounding to x's dtype at the end.
"""
from __future__ import annotations

import torch


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
