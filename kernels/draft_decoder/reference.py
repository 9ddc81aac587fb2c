r"""Specification: one pre-norm decoder layer of a Llama / Qwen2-shaped drafter, int8 weights.

For M new tokens at positions pos0 .. pos0+M-1, with x [M, H] the residual stream (fp32):

    h  = rms_norm(x) * ln1                  rms_norm(x) = x / sqrt(mean(x^2) + eps)
    q, k, v = lin(h, Wq), lin(h, Wk), lin(h, Wv)       lin(h, W) = h @ (q_W * s_W)^T + b_W
    q, k = rope(q), rope(k)                 HF's rotate_half: (a, b) -> (a cos - b sin, b cos + a sin)
                                            for the pair (i, i + D/2) at frequency i
    K[:, pos0:pos0+M], V[:, pos0:pos0+M] = k, v            (caches [n_kv, cap, D])
    a[m, h] = softmax_t(q[m, h] . K[g, t] / sqrt(D)) @ V[g, t],  t <= pos0 + m,  g = h // (n_heads/n_kv)
    x = x + lin(a, Wo)
    h  = rms_norm(x) * ln2
    x = x + lin(silu(lin(h, Wg)) * lin(h, Wu), Wd)

x and the caches are updated in place. Weights are (q int8 [N, K], scale fp32 [N]) pairs as
kernels.quant_linear makes them (q possibly packed); biases (q, k, v, o only) fp32 or None.
"""
from __future__ import annotations

import torch

from kernels.quant_linear import reference as int8


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """t [M, heads, D]; cos, sin [M, D/2]."""
    a, b = t.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def decoder_layer(x, ln1, wq, sq, bq, wk, sk, bk, wv, sv, bv, wo, so, bo, ln2, wg, sg, wu, su, wd, sd,
                  kc, vc, cos, sin, pos0: int, n_heads: int, n_kv: int, eps: float) -> None:
    m = x.shape[0]
    d = sq.numel() // n_heads
    h = rms_norm(x, ln1, eps)
    q = rope(int8.linear(h, wq, sq, bq).view(m, n_heads, d), cos, sin)
    k = rope(int8.linear(h, wk, sk, bk).view(m, n_kv, d), cos, sin)
    v = int8.linear(h, wv, sv, bv).view(m, n_kv, d)
    kc[:, pos0 : pos0 + m] = k.transpose(0, 1)
    vc[:, pos0 : pos0 + m] = v.transpose(0, 1)
    total = pos0 + m
    keys = kc[:, :total].repeat_interleave(n_heads // n_kv, dim=0)  # [n_heads, T, D]
    values = vc[:, :total].repeat_interleave(n_heads // n_kv, dim=0)
    scores = q.transpose(0, 1) @ keys.transpose(1, 2) / d**0.5  # [n_heads, M, T]
    future = torch.arange(total)[None, :] > (pos0 + torch.arange(m))[:, None]
    attn = scores.masked_fill(future, float("-inf")).softmax(-1) @ values  # [n_heads, M, D]
    x += int8.linear(attn.transpose(0, 1).reshape(m, n_heads * d), wo, so, bo)
    h = rms_norm(x, ln2, eps)
    x += int8.linear(torch.nn.functional.silu(int8.linear(h, wg, sg)) * int8.linear(h, wu, su), wd, sd)
