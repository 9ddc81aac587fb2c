"""Logits -> sampling distribution: temperature, top-k, top-p (nucleus), as pure torch.

Speculative sampling is lossless with respect to *this* distribution: the target's processed
probabilities are p, the drafter's processed probabilities are q. Both go through the same
function so that plain sampling and speculative sampling target exactly the same law.
"""
from __future__ import annotations

import torch


def process_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Return probabilities of shape ``logits.shape`` (float32), rows summing to 1.

    logits: [..., V]. temperature > 0. top_k <= 0 disables top-k; top_p >= 1 disables top-p.
    Top-p keeps the smallest set of most likely tokens whose mass reaches top_p (at least one).
    """
    if temperature <= 0:
        raise ValueError("temperature must be > 0; use greedy decoding for temperature 0")
    scores = logits.float() / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        # Mass strictly before each token; a token is kept while that mass is below top_p,
        # so the token that crosses the threshold is kept and the first token always is.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the last dimension (ties go to the lowest id, as torch.argmax does)."""
    return logits.argmax(dim=-1)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of ``probs`` [..., V] -> [...] using ``generator``."""
    flat = probs.reshape(-1, probs.shape[-1])
    drawn = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return drawn.reshape(probs.shape[:-1])
