"""Specification: int4 weights (a scale and an offset per 32) times int8-quantized inputs.

llama.cpp's recipe for its 4-bit formats (Q4_1 weights against Q8_1 activations), in the
layout our kernel reads fastest. The inputs are quantized too because on an AVX2 CPU without
integer products a 4-bit weight costs ~2x more instructions to widen to fp32 than to multiply:
weight-only int4 ran no faster than int8 here (measured: 0.98 vs 0.86 ms for one row through a
1536 -> 8960 layer), while integer products make one row bound by memory bandwidth again.

Weights, for each group of GROUP = 32 consecutive weights of a row:
    offset = fp16(min)
    scale  = fp16((max - offset) / 15)       (1 where that is 0: a constant group, or a range
                                              too small for fp16)
    code   = clamp(round((w - offset) / scale), 0, 15)
    w'     = code * scale + offset
16 bytes of codes and 4 of scale and offset: 5 bits per weight, as Q4_1. (Why fp16 scales and
not fp32, 5.5 bits: a decode step reads every byte, so a tenth fewer bytes is a tenth off a
memory-bound step, and fp16's 11-bit mantissa moves w' by at most 2^-12 of the group's range,
against the codes' 1/30.)
Packing: the 32 codes of a group fill 16 bytes: byte i holds code i in its low nibble and code
16+i in its high nibble. Rows come in panels of PANEL = 4, interleaved by group, so that the 4
rows a decode tile reads are one contiguous stream (the hardware prefetcher follows one
stream; four short rows of 768 bytes each it did not, and int4 ran at half of memory speed):
    packed [N/4, K/32, 4, 16] uint8,  scale [N/4, K/32, 4] fp16,  offset [N, K/32] fp16
Inputs, for each group of 32 values of a row:
    dx = max |x| / 127  (1 where all are zero),  xq = round_half_even(x / dx)  in [-127, 127]
Linear:
    y[m, n] = sum_g scale[n, g] * dx[m, g] * sum_k code[n, k] * xq[m, k]
              + sum_g offset[n, g] * sum_{k in g} x[m, k]   (exact inputs)   + b[n]
    each row of x on its own: a row's result never depends on the other rows in the call
    (batch invariance, as kernels/quant_linear), so greedy speculation on an int4 target is
    token-identical to plain decoding of that same int4 target.

x: [..., K] bf16 or fp32, K a multiple of 32, N a multiple of 4; bias [N] or None.
"""
from __future__ import annotations

import torch

GROUP = 32
PANEL = 4


def supports(n: int, k: int) -> bool:
    """Whether an [n, k] weight can be held in int4 (else a caller keeps another format)."""
    return n % PANEL == 0 and k % GROUP == 0 and n > 0 and k > 0


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] (any float dtype) -> (packed, scale, offset) in the panel layout above."""
    n, k = weight.shape
    if not supports(n, k):
        raise ValueError(f"int4 needs rows in fours and columns in {GROUP}s, not [{n}, {k}]")
    w = weight.float().reshape(n, k // GROUP, GROUP)
    lo, hi = w.amin(dim=2), w.amax(dim=2)
    offset = lo.half()
    # The scale spans from the rounded offset, so the group's largest weight stays reachable;
    # the codes are rounded against the scale as stored.
    scale = ((hi - offset.float()) / 15).half()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((w - offset.float()[..., None]) / scale.float()[..., None]).clamp_(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)  # [N, G, 16]
    return _to_panels(packed).contiguous(), _to_panels(scale).contiguous(), offset.contiguous()


def _to_panels(t: torch.Tensor) -> torch.Tensor:
    """[N, G, ...] -> [N/4, G, 4, ...]."""
    return t.reshape(t.shape[0] // PANEL, PANEL, *t.shape[1:]).transpose(1, 2)


def _from_panels(t: torch.Tensor) -> torch.Tensor:
    """[N/4, G, 4, ...] -> [N, G, ...]."""
    t = t.transpose(1, 2)
    return t.reshape(t.shape[0] * PANEL, *t.shape[2:])


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """packed panels -> codes [N, K] uint8 in 0..15."""
    groups = _from_panels(packed)  # [N, G, 16]
    n = groups.shape[0]
    return torch.cat([groups & 0x0F, groups >> 4], dim=2).reshape(n, -1)


def row_scales(scale: torch.Tensor) -> torch.Tensor:
    """scale panels -> [N, K/32] fp32."""
    return _from_panels(scale).float()


def dequantize(packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The weights w' the codes stand for, [N, K] fp32."""
    q = unpack(packed).float()
    n, k = q.shape
    return (q.reshape(n, k // GROUP, GROUP) * row_scales(scale)[..., None] + offset.float()[..., None]).reshape(n, k)


def quantize_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] fp32 -> (xq [M, K] int8-valued fp32, dx [M, K/32])."""
    m, k = x.shape
    groups = x.reshape(m, k // GROUP, GROUP)
    dx = groups.abs().amax(dim=2) / 127
    dx = torch.where(dx > 0, dx, torch.ones_like(dx))
    xq = torch.round(groups / dx[..., None]).clamp_(-127, 127)  # torch.round: half to even
    return xq.reshape(m, k), dx


def linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).float()
    m, k = rows.shape
    codes = unpack(packed).double()
    n = codes.shape[0]
    codes = codes.reshape(n, k // GROUP, GROUP)
    xq, dx = quantize_input(rows)
    xq = xq.double().reshape(m, k // GROUP, GROUP)
    dots = torch.einsum("mgk,ngk->mng", xq, codes)  # exact integers
    y = (dots * dx.double()[:, None, :] * row_scales(scale).double()[None]).sum(-1)
    y += rows.double().reshape(m, k // GROUP, GROUP).sum(-1) @ offset.double().t()
    if bias is not None:
        y += bias.double()
    return y.to(x.dtype).reshape(*x.shape[:-1], n)
