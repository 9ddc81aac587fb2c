"""Specification: causal attention of Q new rows against a KV cache whose last Q positions are
those rows.

query [1, H, Q, D]; key, value [1, KVH, L, D] with H a multiple of KVH (grouped-query heads share
a key/value head); row i sees keys 0 .. L - Q + i. Returns [1, Q, H, D] (the layout a model's
output projection reshapes), computed in fp64 and cast back to the query's dtype.

This reference is one row at a time and computes in fp64, so it is batch-invariant too: how
PyTorch's matmul blocks the heads or splits the keys over threads moves fp64 roundings, far
below the one rounding to fp32 at the end. It is not bit-identical to the compiled kernel.
"""
from __future__ import annotations

import torch


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    _, H, Q, D = query.shape
    KVH, L = key.shape[1], key.shape[2]
    group = H // KVH
    k = key[0].double().repeat_interleave(group, dim=0)  # [H, L, D]
    v = value[0].double().repeat_interleave(group, dim=0)
    rows = []
    for i in range(Q):
        visible = L - Q + i + 1
        q = query[0, :, i : i + 1].double()  # [H, 1, D]
        weights = ((q @ k[:, :visible].transpose(1, 2)) * scaling).softmax(-1)
        rows.append(weights @ v[:, :visible])  # [H, 1, D]
    return torch.cat(rows, dim=1).transpose(0, 1).unsqueeze(0).float().to(query.dtype)  # [1, Q, H, D]
