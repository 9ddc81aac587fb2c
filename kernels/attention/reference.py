"""Specification: causal attention of Q new rows against a KV cache whose last Q positions are
those rows.

query [1, H, Q, D]; key, value [1, KVH, L, D] with H a multiple of KVH (grouped-query heads share
a key/value head); row i sees keys 0 .. L - Q + i. Returns [1, Q, H, D] (the layout a model's
output projection reshapes), computed in fp64 and cast back to the query's dtype.

This reference is one row at a time and computes in fp64, so it is batch-invariant too: how
PyTorch's matmul blocks the heads or splits the keys over threads moves fp64 roundings, far
below the one rounding to fp32 at the end. It is not bit-identical to the compiled kernel.

rotary_attention: the same attention fed from a layer's q / k / v projection: the rotary
embedding (``rotate``, PyTorch's ops, whose roundings the compiled backend reproduces), the new
keys and values written into the cache, then causal_attention.
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


def rotate(t: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """The rotate-half rotary embedding, t * cos + cat(-t2, t1) * sin, as t * cos + roll(t) *
    signed_sin (signed_sin = cat(-sin1, sin2): (-a) * b is -(a * b) exactly, so the bits are the
    same). t [rows, heads, D], cos / signed_sin [rows, 1, D]."""
    return t * cos + t.roll(t.shape[-1] // 2, dims=-1) * signed_sin


def rotary_attention(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, layer: int, start: int, heads: int, kv_heads: int, scaling: float) -> torch.Tensor:
    """A decoder layer's attention after its q / k / v projection: qkv [n, (H + 2 KVH) D] fp32
    (queries, keys, values side by side), cos / signed_sin [n, D]. The new rows' queries and
    keys rotated; their keys and values written into rows start .. start + n - 1 of the layer's
    cache (k_cache / v_cache [layers, KVH, capacity, D], rounded to its dtype); the queries
    attended over the cache up to them (causal_attention). Returns [n, H D]."""
    n, D = qkv.shape[0], k_cache.shape[-1]
    end = start + n
    qk = rotate(qkv[:, : (heads + kv_heads) * D].view(n, heads + kv_heads, D), cos[:, None], signed_sin[:, None])
    k_cache[layer, :, start:end] = qk[:, heads:].transpose(0, 1)
    v_cache[layer, :, start:end] = qkv[:, (heads + kv_heads) * D :].view(n, kv_heads, D).transpose(0, 1)
    query = qk[:, :heads].transpose(0, 1).unsqueeze(0)
    return causal_attention(query, k_cache[layer : layer + 1, :, :end], v_cache[layer : layer + 1, :, :end], scaling)[0].reshape(n, heads * D)
