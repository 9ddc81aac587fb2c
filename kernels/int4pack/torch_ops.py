"""torch's own weight-only kernels, fed the layouts they read (reference.py is the spec).

    device   4-bit pack                                     4-bit matmul                    8-bit matmul
    CUDA     _convert_weight_to_int4pack(uint8 [N, K/2])    _weight_int4pack_mm (bf16 x)    _weight_int8pack_mm
    MPS      _convert_weight_to_int4pack(uint8 [N, K/2])    _weight_int4pack_mm (fp16 x)    _weight_int8pack_mm
    CPU      _convert_weight_to_int4pack_for_cpu(int32 [N, K])  _weight_int4pack_mm_for_cpu  _weight_int8pack_mm

CUDA and MPS take the codes two to a byte, the even column in the high nibble (ATen's
int4mm.cu: "[n][k / 2] uint8: v[0]H ..."; MPS's weight_to_int4pack swaps them into the order
its kernel reads), and return an int32 tensor [N/8, K/(16 tiles), 32, tiles/2]; the CPU takes
one code per int32 and returns uint8 [N, K/2]. Both hold half a byte a weight. The packing runs
on the device that will multiply (the layouts differ per device), so ``pack`` is given it.

CUDA's kernel needs compute capability 8.0 (its bf16 tensor-core path) and bf16 activations;
MPS's takes fp32, fp16 or bf16 (Metal 3.1 for bf16), Tandem uses fp16 there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.int4pack.reference import GROUP, N_TILE, AffineInt4, inner_k_tiles, scales_and_zeros, supports


@dataclass(frozen=True)
class Int4Packed:
    """weight: the device's packed codes; scales_zeros [K/32, N, 2] in ``dtype``."""

    weight: torch.Tensor
    scales_zeros: torch.Tensor
    out_features: int
    in_features: int

    @property
    def dtype(self) -> torch.dtype:
        return self.scales_zeros.dtype

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + self.scales_zeros.nbytes


def device_dtype(device: torch.device | str) -> torch.dtype:
    """The activation dtype torch's int4 kernel reads on ``device``: bf16 on CUDA (the only one
    its kernel takes) and the CPU, fp16 on MPS (native on every Apple GPU)."""
    return torch.float16 if torch.device(device).type == "mps" else torch.bfloat16


def unsupported_reason(device: torch.device | str) -> str | None:
    """Why torch's int4 kernel cannot run on ``device`` (None: it can)."""
    device = torch.device(device)
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        # 2.5 changed the packing's input to uint8 nibbles; 2.6 split off the CPU layout.
        return f"torch {torch.__version__} predates the int4 kernels' current layouts (2.6 or later)"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device"
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            return (f"torch's int4 kernel needs a CUDA GPU of compute capability 8.0 or later (Ampere, RTX 30xx); "
                    f"this one is {major}.{minor}")
        return None
    if device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        return None if mps is not None and mps.is_available() else "no MPS device"
    if device.type == "cpu":
        return None
    return f"no int4 weight kernel in torch for {device.type}"


def int8_supports(n: int, k: int, device: torch.device | str) -> bool:
    """Whether ``_weight_int8pack_mm`` takes an [n, k] weight on ``device`` (MPS: both in 32s)."""
    if torch.device(device).type == "mps":
        return n % 32 == 0 and k % 32 == 0
    return n > 0 and k > 0


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..15 -> uint8 [N, K/2], column 2i in the high nibble of byte i."""
    c = codes.to(torch.uint8)
    return ((c[:, ::2] << 4) | c[:, 1::2]).contiguous()


def pack(weights: AffineInt4, device: torch.device | str, dtype: torch.dtype | None = None) -> Int4Packed:
    """The affine form packed for ``device``'s kernel, scales and zeros in ``dtype`` (default:
    ``device_dtype``). The codes move to the device first; the packing runs there."""
    device = torch.device(device)
    dtype = dtype or device_dtype(device)
    n, k = weights.codes.shape
    if not supports(n, k):
        raise ValueError(f"torch's int4 kernels need N in {N_TILE}s and K in {GROUP}s, not [{n}, {k}]")
    codes = weights.codes.to(device)
    if device.type == "cpu":
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), inner_k_tiles(k))
    else:
        packed = torch.ops.aten._convert_weight_to_int4pack(pack_nibbles(codes), inner_k_tiles(k))
    sz = scales_and_zeros(weights.scale.to(device), weights.offset.to(device), dtype)
    return Int4Packed(packed, sz, n, k)


def _rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).to(dtype).contiguous()


def linear(x: torch.Tensor, packed: Int4Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w'^T (+ bias) with the device's int4 kernel; x [..., K] is cast to the packed
    dtype for the call and y comes back in x's dtype."""
    rows = _rows(x, packed.dtype)
    if packed.weight.device.type == "cpu":
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed.weight, GROUP, packed.scales_zeros)
    else:
        y = torch.ops.aten._weight_int4pack_mm(rows, packed.weight, GROUP, packed.scales_zeros)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype).reshape(*x.shape[:-1], packed.out_features)


def linear_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ (q * scale[:, None])^T (+ bias); the op wants x and scale in one dtype."""
    rows = _rows(x, scale.dtype)
    y = torch.ops.aten._weight_int8pack_mm(rows, q, scale)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype).reshape(*x.shape[:-1], q.shape[0])
