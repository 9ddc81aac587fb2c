"""A drafter's LM head over a token subset (kernels.draft_head), plus the request's own tokens.

The base subset is fixed per drafter (engine.drafters.draft_vocab); tokens of the current request's
context that it lacks (an identifier the prompt defines, a rare word the target just wrote) are
added as a small extra block, so they stay proposable. Logits are [S + E] over ``ids``; the
drafter maps an index back with ``ids`` and scatters distributions back with ``to_vocab``.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from kernels import draft_head, quant_linear


def _subset_logits(hidden: torch.Tensor, rows: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """int8 rows take the int16-input kernel (quant_linear.linear_a16): on the default drafter's
    32k rows it ran 0.78 ms a step against 1.09 ms for fp32 inputs (draft_head), with the same
    top-1 token at all 3,000 positions of a prose and a code text (its inputs are rounded to
    1/65534 of their block's largest, far below the weights' 1/254)."""
    if scale is None:
        return draft_head.subset_logits(hidden, rows, None)
    return quant_linear.linear_a16(hidden.float(), rows, scale)


class ReducedHead:
    """weight: the drafter's full output embedding [V, H] (kept by reference, not copied).
    base_ids: the subset (None keeps every token). int8: store the kept rows as int8 (the
    head then costs a quarter of fp32, half of bf16)."""

    def __init__(self, weight: torch.Tensor, base_ids: Iterable[int] | None, int8: bool = False) -> None:
        self.weight = weight.detach()
        self.vocab_size = weight.shape[0]
        self.int8 = int8
        ids = torch.arange(self.vocab_size) if base_ids is None else torch.tensor(sorted(set(base_ids)), dtype=torch.long)
        if ids.numel() and (ids[0] < 0 or ids[-1] >= self.vocab_size):
            raise ValueError("token subset holds ids outside the drafter's vocabulary")
        self.base_ids = ids
        # The full head at the model's own precision needs no copy of its 150k rows.
        self._base = (self.weight, None) if base_ids is None and not int8 else self._rows(ids)
        self._member = torch.zeros(self.vocab_size, dtype=torch.bool)
        self._member[ids] = True
        self.reset()

    @property
    def size(self) -> int:
        return self.ids.numel()

    def reset(self) -> None:
        """Drop the previous request's extra tokens."""
        self._extra_ids: list[int] = []
        self._extra = None
        self._in_request = self._member.clone()
        self.ids = self.base_ids

    def include(self, token_ids: Iterable[int]) -> None:
        """Make these tokens proposable for the rest of the request."""
        new = [t for t in dict.fromkeys(token_ids) if 0 <= t < self.vocab_size and not self._in_request[t]]
        if not new:
            return
        self._in_request[new] = True
        self._extra_ids.extend(new)
        extra_ids = torch.tensor(self._extra_ids, dtype=torch.long)
        self._extra = self._rows(extra_ids)
        self.ids = torch.cat([self.base_ids, extra_ids])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> fp32 logits [..., size] over ``ids``."""
        z = _subset_logits(hidden, *self._base)
        if self._extra is None:
            return z
        return torch.cat([z, _subset_logits(hidden, *self._extra)], dim=-1)

    def token(self, index: int) -> int:
        return int(self.ids[index])

    def to_vocab(self, values: torch.Tensor) -> torch.Tensor:
        """A distribution over ``ids`` [..., size] as one over the vocabulary, zero elsewhere."""
        return draft_head.to_vocab(values, self.ids, self.vocab_size)

    def _rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows = self.weight.index_select(0, ids)
        if self.int8:
            return quant_linear.quantize(rows)
        return rows.contiguous(), None
