"""A separate, smaller model with the target's tokenizer drafts k tokens autoregressively."""
from __future__ import annotations

import torch

from engine.drafters.base import Draft
from engine.runner import ModelRunner
from engine.sampler import Sampler


class DraftModelDrafter:
    free = False

    def __init__(self, model, name: str = "draft model") -> None:
        self.runner = ModelRunner(model)
        self.name = name

    def reset(self) -> None:
        self.runner.reset()

    def prepare(self, prompt: list[int]) -> None:
        self.runner.reset()
        if len(prompt) > 1:
            self.runner.forward(prompt[:-1])

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        if k <= 0:
            return Draft(())
        # Feed whatever the drafter has not seen yet: after a full acceptance that is the last
        # draft token plus the target's bonus token, otherwise just the target's token.
        pending = context[self.runner.length :]
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        for _ in range(k):
            logits = self.runner.forward(pending)[-1]
            token, dist = sampler.choose(logits)
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
            pending = [token]
        # The last draft token is not fed: it is only needed if accepted, and then it is fed
        # together with the bonus token in the next round.
        probs = torch.stack(dists) if dists else None
        return Draft(tuple(tokens), probs)

    def observe(self, valid_length: int) -> None:
        self.runner.crop(valid_length)
