"""4-bit weights on CUDA and Apple MPS (and the CPU) through torch's own int4 weight-only kernels.

Why: on a GPU or a Mac a decode step reads every weight once, so 16-bit weights cap the model
size at what fits in VRAM / unified memory at 2 bytes a weight (~3-4B parameters on an 8 GB GPU
or a 16 GB Mac). Group-32 affine 4-bit is 5 bits a weight with its scales: 8B-class models fit
those machines, and a memory-bound step reads ~3x fewer bytes.

    reference.py   the spec: the affine form, torch's scale/zero convention, dequantization
    torch_ops.py   packing for each device and the aten ops (CUDA, MPS, CPU)

The input is the group-32 affine form (``AffineInt4``) shared by Tandem's own int4, GGUF Q4_0,
Q4_1 and the 32-weight sub-blocks of Q4_K. Tensors kept at 8 bits (GGUF Q5/Q6_K/Q8_0, LM heads)
use the int8 per-channel op. No backend choice here: the op is the one for the tensor's device.
"""
from __future__ import annotations

from kernels.int4pack.reference import (
    GROUP,
    AffineInt4,
    dequantize,
    dequantize_int8,
    quantize,
    quantize_int8,
    supports,
)
from kernels.int4pack.torch_ops import (
    Int4Packed,
    device_dtype,
    int8_supports,
    linear,
    linear_int8,
    pack,
    unsupported_reason,
)

__all__ = ["GROUP", "AffineInt4", "Int4Packed", "dequantize", "dequantize_int8", "device_dtype", "int8_supports", "linear",
           "linear_int8", "pack", "quantize", "quantize_int8", "supports", "unsupported_reason"]
