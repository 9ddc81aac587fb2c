"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
context's trailing n-gram. No model, so drafting is free; strong on rewriting, editing and code
that quotes its input."""
from __future__ import annotations

import torch

from engine.core.sampler import Sampler
from engine.drafters.base import Draft, DrafterBase


def find_continuation(
    context: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1
) -> list[int]:
    """Up to k tokens following the most recent earlier match of the longest trailing n-gram."""
    if k <= 0 or len(context) < 2:
        return []
    ids = torch.tensor(context)
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        tail = ids[-n:]
        windows = ids[:-1].unfold(0, n, 1)  # every n-gram that has at least one token after it
        hits = (windows == tail).all(dim=1).nonzero().flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return context[start : start + k]
    return []


class PromptLookupDrafter(DrafterBase):
    name = "prompt lookup"
    free = True

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def reset(self) -> None:
        pass

    def prepare(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        # Deterministic proposals: q is one-hot, which the verifier handles when probs is None.
        return Draft(tuple(find_continuation(context, k, self.max_ngram)))

    def observe(self, valid_length: int) -> None:
        pass
