"""Logits -> sampling distribution: temperature, top-k, top-p (nucleus), as pure torch.

Speculative sampling is lossless with respect to *this* distribution: the target's processed
probabilities are p, the drafter's processed probabilities are q. Both go through the same
function so that plain sampling and speculative sampling target exactly the same law.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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


#: Tokens per block of the two-level inverse-CDF draw in ``sample_from``.
_DRAW_BLOCK = 1024


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of ``probs`` [..., V] -> [...] using ``generator``.

    Inverse CDF in two levels, in float64: one uniform per row picks a block of
    ``_DRAW_BLOCK`` tokens by the blocks' masses, then a token inside it by the block's prefix
    sums. torch.multinomial draws the same law but took 3.3-4.4 ms a token over a 151,936-token
    vocabulary on 2 cores (about a tenth of a sampled decode step at 4k tokens of context, a
    seventh on short prompts); this takes ~0.16 ms. No host synchronisation (CUDA logits stay
    on the device), and a token of probability 0 is never drawn: its interval in the prefix sums
    is empty, and where rounding carries the uniform past the last positive block or token, the
    draw falls back to that last one.
    """
    flat = probs.reshape(-1, probs.shape[-1]).float()
    rows, vocab = flat.shape
    n_blocks = -(-vocab // _DRAW_BLOCK)
    blocks = F.pad(flat, (0, n_blocks * _DRAW_BLOCK - vocab)).view(rows, n_blocks, _DRAW_BLOCK)
    mass = blocks.sum(-1, dtype=torch.float64)
    cum = mass.cumsum(-1)
    point = torch.rand(rows, 1, dtype=torch.float64, generator=generator, device=flat.device) * cum[:, -1:]
    block = torch.minimum(torch.searchsorted(cum, point, right=True), _last_positive(mass))
    inside = blocks.gather(1, block.unsqueeze(-1).expand(rows, 1, _DRAW_BLOCK)).squeeze(1)
    before = cum.gather(-1, block) - mass.gather(-1, block)
    prefix = inside.double().cumsum(-1) + before
    token = torch.minimum(torch.searchsorted(prefix, point, right=True), _last_positive(inside))
    return (block * _DRAW_BLOCK + token).squeeze(-1).reshape(probs.shape[:-1])


def _last_positive(values: torch.Tensor) -> torch.Tensor:
    """[rows, 1]: the index of each row's last positive entry."""
    index = torch.arange(values.shape[-1], device=values.device)
    return torch.where(values > 0, index, -1).amax(-1, keepdim=True)
