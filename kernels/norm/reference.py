"""Specification: a decoder's residual add and the RMSNorm after it, as transformers computes
them on fp32 rows, op for op (so the compiled backend, which must give the same bits, has a
fixed sequence of roundings to follow).

x, delta [n, H] fp32; weight [H] fp32. Returns (x + delta, weight * (s * rsqrt(mean(s^2) + eps)))
with s = x + delta.
"""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm on fp32 rows, op for op."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + delta
    return s, rms_norm(s, weight, eps)
