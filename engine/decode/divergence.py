"""Where two outputs of the same target part ways, and why (how close the call was)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.runners.runner import ModelRunner


@dataclass(frozen=True)
class Divergence:
    """position: index of the first differing new token. top2_gap: the target's logit margin
    between its two best tokens there (computed one token at a time, as plain decoding does);
    a small gap means the two runs' rounding could legitimately choose differently."""

    position: int
    plain_token: int | None
    speculative_token: int | None
    top2_gap: float | None
    top2_tokens: tuple[int, int] | None


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def explain_divergence(model, prompt_ids: list[int], plain: list[int], speculative: list[int]) -> Divergence | None:
    pos = first_difference(plain, speculative)
    if pos is None:
        return None
    runner = ModelRunner(model)
    logits = runner.forward(list(prompt_ids) + list(plain[:pos]))[-1]
    top = torch.topk(logits, 2)
    return Divergence(
        position=pos,
        plain_token=plain[pos] if pos < len(plain) else None,
        speculative_token=speculative[pos] if pos < len(speculative) else None,
        top2_gap=float(top.values[0] - top.values[1]),
        top2_tokens=(int(top.indices[0]), int(top.indices[1])),
    )
