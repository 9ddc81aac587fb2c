"""Choosing a token from logits under the request's settings, with an explicit generator."""
from __future__ import annotations

import torch

from engine.core.settings import DecodeSettings
from kernels.sampling import greedy_token, process_logits, sample_from


def generator_device(device: torch.device | str | None) -> torch.device:
    """Where a request's generator lives: on CUDA next to the logits, so that draws need no
    host round trip; on the CPU otherwise (MPS has no float64 for verification's race weights,
    and CPU generators keep seeded runs identical to earlier releases)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    return device if device.type == "cuda" else torch.device("cpu")


class Sampler:
    """``device``: the target's device; only decides where the generator lives (see
    ``generator_device``). The same seed gives different samples on CUDA and on CPU."""

    def __init__(self, settings: DecodeSettings, device: torch.device | str | None = None) -> None:
        self.greedy = settings.mode == "greedy"
        self.temperature = settings.temperature
        self.top_k = settings.top_k
        self.top_p = settings.top_p
        self.generator = torch.Generator(device=generator_device(device)).manual_seed(settings.seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return process_logits(logits, self.temperature, self.top_k, self.top_p)

    def choose_on_device(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Like ``choose`` but the token stays a 0-d tensor on the logits' device: no host sync
        (a drafter feeds it straight back into its next pass)."""
        if self.greedy:
            return greedy_token(logits), None
        p = self.probs(logits)
        if p.device != self.generator.device:  # MPS logits, CPU generator: draw on the host
            return sample_from(p.to(self.generator.device), self.generator).to(p.device), p
        return sample_from(p, self.generator), p

    def choose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """One token from logits [V]; returns (token, the distribution it was drawn from)."""
        token, p = self.choose_on_device(logits)
        return int(token), p
