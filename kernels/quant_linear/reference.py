"""Specification: int8 weight-only linear with one scale per output row.

Quantization (symmetric, round to nearest even):
    scale[n] = max_k |W[n, k]| / 127        (1 where the row is all zeros)
    q[n, k]  = round(W[n, k] / scale[n])      in [-127, 127]
Linear:
    y = round_to_x_dtype(fp32(x) @ (fp32(q) * scale[:, None])^T + fp32(b))
    each row of x computed on its own: a row's result never depends on the other rows in the
    call (batch invariance), so verifying k+1 rows of an int8 target gives the bits that k+1
    one-row decoding steps give, and greedy speculation on it stays token-identical.

int16 inputs (``linear_a16``, int8 targets): each row of x is quantized on its own, per block
of INPUT_BLOCK = 256 values (the last block may be shorter):
    s[m, b]  = max_{k in b} |x[m, k]| / 32767                (fp32; 0 where the block is all zeros)
    xq[m, k] = round_half_even(fp32(x[m, k] * fp32(32767 / max)))   in [-32767, 32767]
    y[m, n]  = scale[n] * sum_b s[m, b] * sum_{k in b} q[n, k] * xq[m, k]   (+ b[n])
the inner sums exact integers, the sum over blocks in fp32. The inputs' rounding error is at
most max / 65534 per value, far below the weight's (max / 254); the fast kernel multiplies 16
int16 pairs per instruction instead of widening weights to fp32 (int16_inputs.h). Batch
invariance holds as above.

x: [..., K] (bf16 or fp32), q: [N, K] int8 (or packed [N/8, K, 8], kernels/linear/packing.py), scale: [N] fp32, bias: [N] or None. Drafters use it
(their precision changes what they propose, never what the target accepts) and int8 targets.
"""
from __future__ import annotations

import torch

INPUT_BLOCK = 256  # inputs per scale in linear_a16 (int16_inputs.h: kBlock)


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


def quantize_inputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq [M, K] int16, s [M, blocks] fp32), as specified above."""
    x = x.float()
    m, k = x.shape
    blocks = -(-k // INPUT_BLOCK)
    padded = torch.nn.functional.pad(x, (0, blocks * INPUT_BLOCK - k)).reshape(m, blocks, INPUT_BLOCK)
    amax = padded.abs().amax(dim=2)
    inv = torch.where(amax > 0, 32767.0 / amax, torch.zeros_like(amax))
    xq = torch.round(padded * inv[..., None]).reshape(m, -1)[:, :k].to(torch.int16)
    return xq.contiguous(), (amax / 32767.0).contiguous()


def linear_a16(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    m, k = rows.shape
    xq, s = quantize_inputs(rows)
    y = torch.zeros(m, q.shape[0], dtype=torch.float32, device=rows.device)
    for b in range(s.shape[1]):
        cols = slice(b * INPUT_BLOCK, min(k, (b + 1) * INPUT_BLOCK))
        # Exact integer sums: fp64 holds them (|sum| < 2^31), one block of the weight at a time.
        sums = xq[:, cols].double() @ q[:, cols].double().t()
        y += sums.float() * s[:, b:b + 1]
    y = y * scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], q.shape[0])
