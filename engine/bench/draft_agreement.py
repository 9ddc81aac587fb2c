"""How often a drafter's greedy choice equals the target's token, teacher-forced, per head.

Acceptance measured in a speculative run depends on k and on where the controller switched
drafting off; this is the clean comparison of two heads on the same text: feed prompt + the
target's own output through the drafter once, and at every output position ask whether the
drafter's argmax over the full vocabulary, and over the reduced head's proposable tokens (its
subset plus the tokens of the request seen so far, as the drafter itself does), is the token the
target wrote there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.drafters.reduced_head import ReducedHead
from engine.models.runners.runner import ModelRunner


@dataclass(frozen=True)
class Agreement:
    full: float
    reduced: float
    positions: int


@torch.inference_mode()
def draft_agreement(model, head: ReducedHead, full_head: ReducedHead, prompt: list[int], output: list[int]) -> Agreement | None:
    """``head``: the reduced head (only its base subset is read; its request state is left
    untouched). ``full_head``: every row at the same precision (``full_head_like``). None when
    there is no output to compare."""
    if not output:
        return None
    runner = ModelRunner(model)
    hidden = runner.forward_hidden(list(prompt) + list(output[:-1]), n_last=len(output))
    logits = full_head.logits(hidden)  # [T, V]
    targets = torch.tensor(output)
    full = (logits.argmax(-1) == targets).float().mean().item()
    allowed = torch.zeros(head.vocab_size, dtype=torch.bool)
    allowed[head.base_ids] = True
    allowed[torch.tensor(prompt)] = True
    hits = 0
    for i, token in enumerate(output):
        hits += int(logits[i].masked_fill(~allowed, float("-inf")).argmax()) == token
        allowed[token] = True  # the drafter adds tokens of the request as it sees them
    return Agreement(full, hits / len(output), len(output))


def full_head_like(head: ReducedHead) -> ReducedHead:
    """Every vocabulary row at the reduced head's row precision (so the two differ only in
    which tokens they keep)."""
    return ReducedHead(head.weight, None, int8=head.int8)
