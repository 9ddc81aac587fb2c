"""Specification: a GGUF file's quantized weights times inputs quantized the way llama.cpp does.

Why integer products: a decode step reads every weight once, so it is bound by memory only if
the arithmetic per weight is a few integer instructions; verifying k rows in one call costs far
less than k steps only if the per-row work is small. llama.cpp's recipe gets both: the inputs
are quantized to int8 per block, the products are integer, and for K-quants the sub-block
scales and mins are small integers, so a whole super-block's products stay exact in int32:
fp32 work is a handful of multiplies per super-block (256 weights) and row, not per 32.

Inputs, each row of x on its own, per block of QB values (QB = 256 for K-quants, as llama.cpp's
Q8_K; 32 for the legacy types, as its Q8_0 / Q8_1):
    amax = max |x|;  iscale = fp32(127 / amax);  xq = round_half_even(fp32(x * iscale)) in
    [-127, 127];  dx = fp32(amax / 127)          (xq = 0, dx = 0 where amax = 0)
    xs_j = sum of xq over each 32 values (exact integers)
Weights (blocks.py's ``decode``): integer codes c (offset already subtracted for Q4_0, Q5_0 and
Q6_K), integer sub-block scales sc (K-quants), integer mins mn (Q4_K, Q5_K), fp16 d and dmin (or
m for Q4_1 / Q5_1). Per weight row n, input row m and block b (integers, exact in int32):
    S  = sum_e sc_{j(e)} * c_e * xq_e          (sc = 1 for the legacy types)
    Mn = sum_j mn_j * xs_j  (Q4_K, Q5_K: j over the 8 sub-blocks);  Mn = xs_b  (Q4_1, Q5_1)
and then in fp32, each operation rounded on its own (no fused multiply-add, which torch cannot
reproduce), the blocks in order:
    t   = fp32(fp32(d * dx) * fp32(S))  [+ fp32(fp32(o * dx) * fp32(Mn)), o = -dmin or +m]
    acc = acc + t                       (acc = 0 before block 0)
    y   = acc (+ bias)
Every step is exact or one rounding of a value that does not depend on how the integers were
summed, so a fast kernel gives these bits exactly, with any tiling: a row's result never
depends on the other rows in the call (batch invariance: speculation on a GGUF target is
token-identical to its plain decoding).
"""
from __future__ import annotations

import torch

from kernels.gguf_linear.blocks import K_QUANTS, Decoded, T, decode

SUB = 32  # the values one integer input sum xs_j covers


def input_block(qtype) -> int:
    """QB: the values an input scale covers for ``qtype``."""
    return 256 if T(qtype) in K_QUANTS else 32


def quantize_input(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] fp32 -> (xq [M, K] int8, dx [M, K/block] fp32, xs [M, K/32] int32)."""
    m, k = x.shape
    groups = x.reshape(m, k // block, block)
    amax = groups.abs().amax(dim=2, keepdim=True)
    nonzero = amax > 0
    # Tensor / tensor: torch computes ``127 / t`` as reciprocal(t) * 127, two roundings.
    iscale = torch.where(nonzero, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    xq = torch.round(groups * iscale).clamp_(-127, 127).to(torch.int8)  # torch.round: half to even
    dx = torch.where(nonzero, amax / torch.full_like(amax, 127.0), torch.zeros_like(amax))
    xs = xq.reshape(m, k // SUB, SUB).sum(dim=2, dtype=torch.int32)
    return xq.reshape(m, k), dx[..., 0], xs


def block_sums(dec: Decoded, xq: torch.Tensor, xs: torch.Tensor, qtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The exact integers S [nb, M, N] and Mn [nb, M, N] (None for types without mins), as float64
    (every partial sum is an integer below 2^31, exact in float64 whatever the summation order)."""
    n, nb, values = dec.codes.shape
    w = dec.codes.double()
    if dec.sub_scales is not None:
        sub = dec.sub_scales.shape[-1]
        w = (w.unflatten(-1, (sub, -1)) * dec.sub_scales.double()[..., None]).flatten(-2)
    m = xq.shape[0]
    x = xq.double().reshape(m, nb, values).transpose(0, 1)  # [nb, M, B]
    s = torch.bmm(x, w.permute(1, 2, 0))  # [nb, M, N]
    if T(qtype) in (T.Q4_K, T.Q5_K):
        sums = xs.double().reshape(m, nb, -1).transpose(0, 1)  # [nb, M, 8]
        return s, torch.bmm(sums, dec.mins.double().permute(1, 2, 0))
    if T(qtype) in (T.Q4_1, T.Q5_1):
        return s, xs.double().t()[:, :, None].expand(nb, m, n)
    return s, None


def linear_rows(rows: torch.Tensor, raw: torch.Tensor, qtype, n: int, k: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """rows [M, K] fp32 -> [M, N] fp32, exactly as the module docstring says."""
    qtype = T(qtype)
    dec = decode(raw, qtype, n, k)
    xq, dx, xs = quantize_input(rows, input_block(qtype))
    s, mn = block_sums(dec, xq, xs, qtype)
    offset = None
    if mn is not None:
        offset = -dec.dmin if qtype in K_QUANTS else dec.dmin
    acc = torch.zeros(rows.shape[0], n, dtype=torch.float32)
    for b in range(dec.codes.shape[1]):
        scale = dec.d[None, :, b] * dx[:, b, None]  # [M, N] fp32
        t = scale * s[b].float()
        if offset is not None:
            t = t + (offset[None, :, b] * dx[:, b, None]) * mn[b].float()
        acc = acc + t
    if bias is not None:
        acc = acc + bias.float()
    return acc


def linear(x: torch.Tensor, raw: torch.Tensor, qtype, n: int, k: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype (computed in fp32)."""
    rows = x.reshape(-1, k).float()
    y = linear_rows(rows, raw, qtype, n, k, bias)
    return y.to(x.dtype).reshape(*x.shape[:-1], n)
