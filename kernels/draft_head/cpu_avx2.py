"""CPU fast path: the subset rows through the AVX2 linear kernels (int8 rows via
kernels.quant_linear, bf16 rows via kernels.linear), fp32 out. Scatter and argmax are already
single fused torch ops."""
from __future__ import annotations

import torch

from kernels.draft_head.reference import greedy_ids, to_vocab
from kernels.linear import cpu_avx2 as bf16_kernel
from kernels.quant_linear import cpu_avx2 as int8_kernel


def available() -> bool:
    return int8_kernel.available() and bf16_kernel.available()


def subset_logits(
    hidden: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None
) -> torch.Tensor:
    h = hidden.float()
    if scale is not None:
        return int8_kernel.linear(h, weight, scale)
    if weight.dtype == torch.bfloat16:
        return bf16_kernel.linear(h, weight)
    return h @ weight.float().t()


__all__ = ["available", "greedy_ids", "subset_logits", "to_vocab"]
