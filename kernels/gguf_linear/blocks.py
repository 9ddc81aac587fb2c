"""GGUF's quantized blocks, decoded in torch: their integer codes and scales, and the weights
they stand for, bit for bit as ``gguf.quants.dequantize`` (the numpy reference in gguf-py).

A row of K weights is K / block_size blocks of type_size bytes (gguf.GGML_QUANT_SIZES):

    Q4_0  32 | 18 B: fp16 d, 16 B nibbles                    w = d * (q - 8)
    Q4_1  32 | 20 B: fp16 d, fp16 m, 16 B nibbles            w = d * q + m
    Q5_0  32 | 22 B: fp16 d, 4 B high bits, 16 B nibbles     w = d * (q - 16)
    Q5_1  32 | 24 B: fp16 d, fp16 m, 4 B high bits, nibbles  w = d * q + m
    Q8_0  32 | 34 B: fp16 d, 32 int8                        w = q * d
    Q4_K 256 | 144 B: fp16 d, fp16 dmin, 12 B of 6-bit scales and mins (8 each), 128 B nibbles
                                                             w = (d * sc_j) * q - dmin * m_j
    Q5_K 256 | 176 B: as Q4_K, then 32 B of high bits before the nibbles (q 5-bit)
    Q6_K 256 | 210 B: 128 B low nibbles, 64 B high 2 bits, 16 int8 scales, fp16 d
                                                             w = (d * sc_j) * (q - 32), j per 16

(the products in that order, each rounded to fp32, as numpy computes them). In a legacy block
byte i holds element i in its low nibble and element 16 + i in its high one; in a Q4_K/Q5_K
block each 32 bytes hold two sub-blocks (low nibbles, then high). ``decode`` keeps the pieces
apart for the integer linear (reference.py); ``dequantize`` combines them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
SUPPORTED_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
WITH_MINS = (T.Q4_1, T.Q5_1, T.Q4_K, T.Q5_K)  # types with an offset term (mins / m)


@dataclass(frozen=True)
class Decoded:
    """One tensor's blocks taken apart: ``codes`` [N, nb, B] int16 (the offset of Q4_0, Q5_0 and
    Q6_K already subtracted: Q4_0 -8..7, Q5_0 -16..15, Q6_K -32..31), ``d`` [N, nb] fp32 (the
    fp16 block scale), ``sub_scales`` [N, nb, 8 | 16] int16 (K-quants, else None), ``mins`` and
    ``dmin``: Q4_K/Q5_K's [N, nb, 8] int16 and [N, nb] fp32; Q4_1/Q5_1 keep m in ``dmin`` (no
    ``mins``)."""

    codes: torch.Tensor
    d: torch.Tensor
    sub_scales: torch.Tensor | None = None
    mins: torch.Tensor | None = None
    dmin: torch.Tensor | None = None


def block_shape(qtype) -> tuple[int, int]:
    """(values, bytes) of one block of ``qtype``."""
    return GGML_QUANT_SIZES[T(qtype)]


def row_bytes(qtype, k: int) -> int:
    values, size = block_shape(qtype)
    if k % values:
        raise ValueError(f"{T(qtype).name} rows hold multiples of {values} values, not {k}")
    return k // values * size


def check_raw(raw: torch.Tensor, qtype, n: int, k: int) -> None:
    if T(qtype) not in SUPPORTED_TYPES:
        raise ValueError(f"GGUF type {T(qtype).name} is not supported (supported: {[t.name for t in SUPPORTED_TYPES]})")
    want = (n, row_bytes(qtype, k))
    if raw.dtype != torch.uint8 or tuple(raw.shape) != want:
        raise ValueError(f"{T(qtype).name} [{n}, {k}] needs raw uint8 {list(want)}, got {raw.dtype} {list(raw.shape)}")


def _shifts(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


def _fp16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    return blocks[..., at:at + 2].contiguous().view(torch.float16)[..., 0].float()


def _nibbles_32(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32] values: low nibbles, then high."""
    return ((qs[..., None, :] >> _shifts(0, 4)[:, None]) & 0x0F).flatten(-2)


def _bits_32(qh: torch.Tensor) -> torch.Tensor:
    """[..., 4] bytes of a little-endian uint32 -> [..., 32] bits, bit j = value j."""
    return ((qh[..., :, None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten(-2)


def k_scales_mins(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> 8 scales and 8 mins, 6 bits each (gguf.quants.Q4_K.get_scale_min)."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_low_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 128] bytes -> [..., 8, 32]: sub-block 2i is the low nibbles of bytes 32i.., 2i+1 the high."""
    q = qs.unflatten(-1, (4, 1, 32)) >> _shifts(0, 4)[:, None]
    return (q & 0x0F).flatten(-3, -2)


def decode(raw: torch.Tensor, qtype, n: int, k: int) -> Decoded:
    """raw [N, row_bytes] uint8 -> its integer codes and scales (see ``Decoded``)."""
    check_raw(raw, qtype, n, k)
    qtype = T(qtype)
    values, size = block_shape(qtype)
    b = raw.reshape(n, k // values, size)
    if qtype == T.Q8_0:
        return Decoded(b[..., 2:].contiguous().view(torch.int8).short(), _fp16(b, 0))
    if qtype in (T.Q4_0, T.Q4_1):
        at = 2 if qtype == T.Q4_0 else 4
        q = _nibbles_32(b[..., at:]).short()
        if qtype == T.Q4_0:
            return Decoded(q - 8, _fp16(b, 0))
        return Decoded(q, _fp16(b, 0), dmin=_fp16(b, 2))
    if qtype in (T.Q5_0, T.Q5_1):
        at = 2 if qtype == T.Q5_0 else 4
        q = (_nibbles_32(b[..., at + 4:]) | (_bits_32(b[..., at:at + 4]) << 4)).short()
        if qtype == T.Q5_0:
            return Decoded(q - 16, _fp16(b, 0))
        return Decoded(q, _fp16(b, 0), dmin=_fp16(b, 2))
    if qtype in (T.Q4_K, T.Q5_K):
        sc, mn = k_scales_mins(b[..., 4:16])
        if qtype == T.Q4_K:
            q = _k_low_nibbles(b[..., 16:])
        else:
            high = ((b[..., 16:48].unflatten(-1, (1, 32)) >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1)
            q = _k_low_nibbles(b[..., 48:]) | (high << 4)
        return Decoded(q.flatten(-2).short(), _fp16(b, 0), sc.short(), mn.short(), _fp16(b, 2))
    # Q6_K: element 128h + 64s + l (s = 0, 1) takes byte 64h + l's nibble s; its high two bits
    # are bits 2t of byte 32h + l' for element 128h + 32t + l'.
    ql = (b[..., 0:128].unflatten(-1, (2, 1, 64)) >> _shifts(0, 4)[:, None]) & 0x0F
    qh = (b[..., 128:192].unflatten(-1, (2, 1, 32)) >> _shifts(0, 2, 4, 6)[:, None]) & 0x03
    q = ql.flatten(-3) | (qh.flatten(-3) << 4)
    return Decoded(q.short() - 32, _fp16(b, 208), b[..., 192:208].contiguous().view(torch.int8).short())


def dequantize(raw: torch.Tensor, qtype, n: int, k: int) -> torch.Tensor:
    """raw [N, row_bytes] uint8 -> weights [N, K] fp32, bit-identical to gguf.quants.dequantize."""
    qtype = T(qtype)
    dec = decode(raw, qtype, n, k)
    q = dec.codes.float()
    if qtype == T.Q8_0:
        w = q * dec.d[..., None]
    elif qtype in (T.Q4_0, T.Q5_0):
        w = dec.d[..., None] * q
    elif qtype in (T.Q4_1, T.Q5_1):
        w = dec.d[..., None] * q + dec.dmin[..., None]
    else:
        sub = dec.sub_scales.shape[-1]
        scale = (dec.d[..., None] * dec.sub_scales.float())[..., None]  # [N, nb, sub, 1]
        w = scale * q.unflatten(-1, (sub, -1))
        if dec.mins is not None:
            w = w - (dec.dmin[..., None] * dec.mins.float())[..., None]
    return w.reshape(n, k)
