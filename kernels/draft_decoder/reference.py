r"""Specification: one pre-norm decoder layer of a Llama / Qwen2-shaped drafter, int8 or int4 weights.

For M new tokens at positions pos0 .. pos0+M-1, with x [M, H] the residual stream (fp32):

    h  = rms_norm(x) * ln1                  rms_norm(x) = x / sqrt(mean(x^2) + eps)
    q, k, v = lin(h, Wq), lin(h, Wk), lin(h, Wv)       lin(h, W) = h @ (q_W * s_W)^T + b_W
    q, k = rope(q), rope(k)                 HF's rotate_half: (a, b) -> (a cos - b sin, b cos + a sin)
                                            for the pair (i, i + D/2) at frequency i
    K[:, pos0:pos0+M], V[:, pos0:pos0+M] = k, v            (caches [n_kv, cap, D], fp32 or fp16)
    a[m, h] = softmax_t(q[m, h] . K[g, t] / sqrt(D)) @ V[g, t],  t <= pos0 + m,  g = h // (n_heads/n_kv)
    x = x + lin(a, Wo)
    h  = rms_norm(x) * ln2
    x = x + lin(silu(lin(h, Wg)) * lin(h, Wu), Wd)

x and the caches are updated in place. Weights are (q int8 [N, K], scale fp32 [N]) pairs as
kernels.quant_linear makes them (q possibly packed), or int4 (packed, scale) pairs as
kernels.int4_linear makes them, with their offsets in ``offsets`` (one per layer: q, k, v, o,
gate, up, down; empty when every layer is int8); biases (q, k, v, o only) fp32 or None.
``int16_inputs``: int8 layers round their inputs to int16 first (kernels.quant_linear's
``linear_a16``; int8 targets, row layout).
"""
from __future__ import annotations

import functools

import torch

from kernels.int4_linear import reference as int4
from kernels.norm.reference import rms_norm  # transformers' RMSNorm, op for op (also what the GGUF runner uses)
from kernels.quant_linear import reference as int8


def _layer_linear(h, w, s, b=None, offset=None, int16_inputs=False):
    if w.dtype == torch.uint8:
        return int4.linear(h, w, s, offset, b)
    if int16_inputs:
        return int8.linear_a16(h, w, s, b)
    return int8.linear(h, w, s, b)


def out_features(w: torch.Tensor, s: torch.Tensor) -> int:
    return w.shape[0] * int4.PANEL if w.dtype == torch.uint8 else s.numel()


def rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """t [M, heads, D]; cos, sin [M, D/2]."""
    a, b = t.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def decoder_layer(x, ln1, wq, sq, bq, wk, sk, bk, wv, sv, bv, wo, so, bo, ln2, wg, sg, wu, su, wd, sd,
                  kc, vc, cos, sin, pos0: int, n_heads: int, n_kv: int, eps: float, offsets=(),
                  int16_inputs: bool = False) -> None:
    oq, ok, ov, oo, og, ou, od = offsets or (None,) * 7
    _linear = functools.partial(_layer_linear, int16_inputs=int16_inputs)
    m = x.shape[0]
    d = out_features(wq, sq) // n_heads
    h = rms_norm(x, ln1, eps)
    q = rope(_linear(h, wq, sq, bq, oq).view(m, n_heads, d), cos, sin)
    k = rope(_linear(h, wk, sk, bk, ok).view(m, n_kv, d), cos, sin)
    v = _linear(h, wv, sv, bv, ov).view(m, n_kv, d)
    kc[:, pos0 : pos0 + m] = k.transpose(0, 1)
    vc[:, pos0 : pos0 + m] = v.transpose(0, 1)
    total = pos0 + m
    keys = kc[:, :total].float().repeat_interleave(n_heads // n_kv, dim=0)  # [n_heads, T, D]; the cache may be fp16
    values = vc[:, :total].float().repeat_interleave(n_heads // n_kv, dim=0)
    scores = q.transpose(0, 1) @ keys.transpose(1, 2) / d**0.5  # [n_heads, M, T]
    future = torch.arange(total)[None, :] > (pos0 + torch.arange(m))[:, None]
    attn = scores.masked_fill(future, float("-inf")).softmax(-1) @ values  # [n_heads, M, D]
    x += _linear(attn.transpose(0, 1).reshape(m, n_heads * d), wo, so, bo, oo)
    h = rms_norm(x, ln2, eps)
    gate = torch.nn.functional.silu(_linear(h, wg, sg, offset=og))
    x += _linear(gate * _linear(h, wu, su, offset=ou), wd, sd, offset=od)
