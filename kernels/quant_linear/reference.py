"""Specification: int8 weight-only linear with one scale per output row.

Quantization (symmetric, round to nearest even):
    scale[n] = max_k |W[n, k]| / 127        (1 where the row is all zeros)
    q[n, k]  = round(W[n, k] / scale[n])      in [-127, 127]
Linear:
    y = round_to_x_dtype(fp32(x) @ (fp32(q) * scale[:, None])^T + fp32(b))
    each row of x computed on its own: a row's result never depends on the other rows in the
    call (batch invariance), so verifying k+1 rows of an int8 target gives the bits that k+1
    one-row decoding steps give, and greedy speculation on it stays token-identical.

x: [..., K] (bf16 or fp32), q: [N, K] int8 (or packed [N/8, K, 8], kernels/linear/packing.py), scale: [N] fp32, bias: [N] or None. Drafters use it
(their precision changes what they propose, never what the target accepts) and int8 targets.
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
    if q.dim() == 3:
        from kernels.linear.packing import unpack

        q = unpack(q)
    return q.float() * scale[:, None]


def linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    w = dequantize(q, scale).t()
    rows = x.reshape(-1, x.shape[-1]).float()
    y = torch.cat([row @ w for row in rows.split(1)]) if rows.shape[0] else rows @ w
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], w.shape[1])
