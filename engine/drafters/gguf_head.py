"""A pruned draft head over a GGUF drafter's LM head, which holds quantized rows, not a matrix.

ReducedHead keeps the rows it scores as int8 (kernels.quant_linear); here those rows come from
the file's blocks (``GgufLinear.dense_rows``), dequantized a chunk at a time so the load never
holds more than a few MB of fp32 rows. The drafter's own full head stays the file's bytes.
Re-rounding the kept rows to int8 changes only what the drafter proposes, never the output:
the target verifies every token.
"""
from __future__ import annotations

import torch

from engine.drafters.reduced_head import ReducedHead
from kernels import quant_linear

_CHUNK = 4096  # rows dequantized at a time (4096 x 896 fp32: 14 MB for the default drafter)


class GgufReducedHead(ReducedHead):
    """``head``: the drafter's GgufLinear (or DenseLinear) LM head; ``base_ids``: the subset."""

    def __init__(self, head, base_ids) -> None:
        self._head = head
        # ReducedHead reads only the shape of ``weight`` when every row comes through _rows.
        super().__init__(torch.empty(head.out_features, head.in_features, device="meta"), base_ids, int8=True)

    def _rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [quant_linear.quantize(self._head.dense_rows(ids[i:i + _CHUNK])) for i in range(0, len(ids), _CHUNK)]
        if not parts:
            return quant_linear.quantize(torch.zeros(0, self._head.in_features))
        return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])
