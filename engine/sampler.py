"""Choosing a token from logits under the request's settings, with an explicit generator."""
from __future__ import annotations

import torch

from engine.settings import DecodeSettings
from kernels.sampling import greedy_token, process_logits, sample_from


class Sampler:
    def __init__(self, settings: DecodeSettings) -> None:
        self.greedy = settings.mode == "greedy"
        self.temperature = settings.temperature
        self.top_k = settings.top_k
        self.top_p = settings.top_p
        self.generator = torch.Generator().manual_seed(settings.seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return process_logits(logits, self.temperature, self.top_k, self.top_p)

    def choose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """One token from logits [V]; returns (token, the distribution it was drawn from)."""
        if self.greedy:
            return int(greedy_token(logits)), None
        p = self.probs(logits)
        return int(sample_from(p, self.generator)), p
