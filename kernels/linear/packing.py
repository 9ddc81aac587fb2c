"""The panel layout of the packed linear kernel: pure functions, no copies kept.

A weight [N, K] becomes [N/8, K, 8]: panel p holds rows 8p..8p+7, interleaved by k, so the 8
weights that one input value meets are adjacent (one 16-byte load in bf16). Same numbers, same
bytes, different order. Only N divisible by 8 packs; callers keep other weights as they are.
"""
from __future__ import annotations

import torch

PANEL = 8


def can_pack(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.shape[0] % PANEL == 0 and weight.shape[0] > 0


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> contiguous [N/8, K, 8]."""
    if not can_pack(weight):
        raise ValueError(f"cannot pack a weight of shape {tuple(weight.shape)}: rows must be a multiple of {PANEL}")
    n, k = weight.shape
    return weight.reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """[N/8, K, 8] -> [N, K] (a copy)."""
    p, k, lanes = packed.shape
    return packed.transpose(1, 2).reshape(p * lanes, k)


def out_features(packed: torch.Tensor) -> int:
    return packed.shape[0] * packed.shape[2]
