"""The drafter interface (the shape of transformers' CandidateGenerator)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.core.sampler import Sampler


@dataclass(frozen=True)
class Draft:
    """tokens: up to k proposed ids. probs: [len(tokens), V] distribution each token was drawn
    from (q) when sampling with a stochastic drafter; None for greedy or deterministic drafts."""

    tokens: tuple[int, ...]
    probs: torch.Tensor | None = None


class DrafterMismatch(ValueError):
    """A drafter that cannot draft for this target (another tokenizer, another architecture);
    the message names what differs, for the user."""


class Drafter(Protocol):
    name: str
    #: True when proposing costs about nothing (no model forward), so k is not cost-limited.
    free: bool

    def reset(self) -> None:
        """Forget everything about the previous request."""

    def prepare(self, prompt: list[int]) -> None:
        """Read the prompt ahead of the first proposal (the drafter's prefill), so that
        per-step draft costs measure drafting alone."""

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        """Propose up to k tokens to follow ``context`` (prompt + generated so far)."""

    def observe(self, valid_length: int) -> None:
        """After verification, the first ``valid_length`` tokens of context + draft are final;
        anything the drafter cached beyond that must be dropped."""

    # Optional: drafters that read the target's own hidden states and KV cache (Gemma 4
    # assistants, MTP layers) also define ``attach_target(runner: ModelRunner) -> None``, which
    # the loop calls with the request's target runner before its prefill.
