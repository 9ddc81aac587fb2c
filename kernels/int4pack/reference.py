"""Specification: group-32 affine 4-bit weights, and int8 per-channel weights, as torch's own
weight-only kernels hold them (``torch_ops.py`` runs them on CUDA, MPS and the CPU).

The input form (``AffineInt4``): for each row n and each group g of GROUP = 32 consecutive
weights of that row,

    w[n, k] = code[n, k] * scale[n, g] + offset[n, g]          code in 0..15, g = k // 32

Tandem's own int4 (kernels/int4_linear: offset = min, scale = (max - min) / 15), GGUF Q4_1
(value = d * q + m) and every 32-weight sub-block of a Q4_K super-block
(value = d * sc_j * q - dmin * m_j: scale = d * sc_j, offset = -dmin * m_j) are all this form;
Q4_0 (d * (q - 8)) is it with offset = -8 d.

torch's convention (aten._weight_int4pack_mm on CUDA and MPS, _weight_int4pack_mm_for_cpu on
the CPU; read in ATen's int4mm.cu, Quantized.metal and int4mm_kernel.cpp, and checked here
numerically against the CPU op): the codes are read as signed int4 values q - 8 in [-8, 7] and

    w'[n, k] = (code[n, k] - 8) * s[g, n] + z[g, n]
    scales_and_zeros [K / 32, N, 2] in the activations' dtype: [..., 0] = s, [..., 1] = z

so s = scale and z = offset + 8 * scale, each rounded once to that dtype (bf16 on CUDA, whose
kernel reads only bf16; fp16 on MPS; bf16, fp16 or fp32 on the CPU). That rounding is the only
difference from the input form: at most half a unit of the dtype's last place on s and z, which
moves a weight by at most 8 ulp(s) / 2 + ulp(z) / 2: in bf16 ~1/30 of a code step for a group
whose zero is a few steps from 0, more where the offset is large against the step (a K-quant
sub-block with a small scale and a large min). ``quantize`` (from float weights) picks s and z
the dtype holds exactly, so there it moves nothing. ``scales_and_zeros`` computes (s, z);
``dequantize`` is what the kernels then compute with.

Shapes the ops take (ATen's checks): K a multiple of 32 (the group; CUDA also needs K a
multiple of 16 x inner_k_tiles, which ``inner_k_tiles`` picks as 8, 4 or 2); N a multiple of 8
on CUDA and MPS (their output tiles) and of 16 on the CPU ("expect N to be dividable by 16").
``supports(n, k)`` asks for N in 16s everywhere, so that a model converts the same way on every
device (every real layer shape is; a tiny test vocabulary of 387 is not). A layer that does not
fit stays as it was (16-bit), never padded.

int8 (``quantize_int8``): one scale per output row, symmetric,

    w'[n, k] = q[n, k] * s[n]          q int8 in [-127, 127], s in the activations' dtype

(aten._weight_int8pack_mm). For tensors a GGUF file holds at more than 4 bits (Q5_*, Q6_K,
Q8_0): rounding those to 4 bits would lose what the file kept, so they stay at 8 bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32
N_TILE = 16  # output rows: CUDA / MPS pack N in 8s, the CPU op in 16s; one rule for every device


@dataclass(frozen=True)
class AffineInt4:
    """codes [N, K] uint8 in 0..15; scale, offset [N, K / 32] (any float dtype)."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor

    def __post_init__(self) -> None:
        n, k = self.codes.shape
        if k % GROUP or self.scale.shape != (n, k // GROUP) or self.offset.shape != (n, k // GROUP):
            raise ValueError(f"affine int4 needs codes [N, K] with K in {GROUP}s and scale/offset [N, K/{GROUP}]; got "
                             f"{tuple(self.codes.shape)}, {tuple(self.scale.shape)}, {tuple(self.offset.shape)}")


def supports(n: int, k: int) -> bool:
    """Whether an [n, k] weight fits torch's int4 kernels (see the module docstring)."""
    return n > 0 and k > 0 and n % N_TILE == 0 and k % GROUP == 0


def inner_k_tiles(k: int) -> int:
    """The CUDA layout's k-tiles per 32-bit word group: 8 (16-byte loads) where K allows."""
    for tiles in (8, 4, 2):
        if k % (16 * tiles) == 0:
            return tiles
    raise ValueError(f"K = {k} is not a multiple of {GROUP}")


def quantize(weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> AffineInt4:
    """weight [N, K] -> the affine form, with scale and offset chosen so that torch's (s, z) in
    ``dtype`` hold them exactly: s = dtype((max - min) / 15), z = dtype(min + 8 s),
    offset = z - 8 s; codes are rounded against those stored values. A constant group (or one
    whose range rounds to 0) gets s = |min| / 8 (z = min + |min| is then exact too) or 1 at 0."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"int4 groups are {GROUP} weights: K = {k} does not divide")
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)
    lo, hi = w.amin(dim=2), w.amax(dim=2)
    s = ((hi - lo) / 15).to(dtype).float()
    flat = s <= 0
    lo_held = lo.to(dtype).float()
    s = torch.where(flat, torch.where(lo_held != 0, lo_held.abs() / 8, torch.ones_like(s)), s)
    z = (torch.where(flat, lo_held, lo) + 8 * s).to(dtype).float()
    offset = z - 8 * s
    codes = torch.round((w - offset[..., None]) / s[..., None]).clamp_(0, 15).to(torch.uint8)
    return AffineInt4(codes.reshape(n, k), s, offset)


def scales_and_zeros(scale: torch.Tensor, offset: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, K/32] scale and offset -> torch's [K/32, N, 2] (s, z = offset + 8 s) in ``dtype``."""
    s = scale.float()
    z = offset.float() + 8 * s
    return torch.stack([s, z], dim=-1).transpose(0, 1).to(dtype).contiguous()


def dequantize(codes: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """The weights the kernels multiply by, [N, K] fp32: (code - 8) * s + z."""
    n, k = codes.shape
    sz = scales_zeros.float().transpose(0, 1)  # [N, K/32, 2]
    q = codes.float().reshape(n, k // GROUP, GROUP) - 8
    return (q * sz[..., 0:1] + sz[..., 1:2]).reshape(n, k)


def dequantize_affine(weights: AffineInt4) -> torch.Tensor:
    """The input form's own weights, [N, K] fp32 (before torch's rounding of s and z)."""
    n, k = weights.codes.shape
    q = weights.codes.float().reshape(n, k // GROUP, GROUP)
    return (q * weights.scale.float()[..., None] + weights.offset.float()[..., None]).reshape(n, k)


def linear(x: torch.Tensor, codes: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ dequantize(codes, scales_zeros)^T in fp32, rounded to x's dtype, then + bias in
    that dtype (the ops return the product in x's dtype; the bias is a separate add)."""
    y = (x.float() @ dequantize(codes, scales_zeros).t()).to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)


def quantize_int8(weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (q int8 [N, K], s [N] in ``dtype``): s = dtype(max |w| / 127) (1 for an
    all-zero row), q rounded against the stored s."""
    w = weight.detach().float()
    s = (w.abs().amax(dim=1) / 127).to(dtype)
    s = torch.where(s.float() > 0, s, torch.ones_like(s))
    q = torch.round(w / s.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, s


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def linear_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """As ``linear`` for int8 rows: x @ (q * s[:, None])^T, rounded to x's dtype, + bias."""
    y = (x.float() @ dequantize_int8(q, scale).t()).to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)
