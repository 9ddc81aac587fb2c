r"""Pure-torch reference for draft verification. This file IS the specification.

Notation (Leviathan et al. 2023, arXiv 2211.17192): **p = target distribution, q = draft
distribution**. The drafter proposed tokens x_1..x_k, x_i ~ q_i. One target pass over
(context, x_1..x_k) gives p_1..p_{k+1}, where p_i is the target's distribution for position i.

Sampling rule, for i = 1..k in order:
    draw u_i ~ U[0, 1); accept x_i iff u_i < p_i(x_i) / q_i(x_i)   (i.e. with prob min(1, p/q))
    at the first rejection i: emit y ~ norm(max(0, p_i - q_i)) and stop.
If all k are accepted, emit a bonus token y ~ p_{k+1}.
The emitted sequence (accepted drafts, then y) is distributed exactly as k+1 tokens sampled
from the target alone would be, whatever q is. A deterministic drafter (prompt lookup) is the
case q_i = one_hot(x_i): accept with prob p_i(x_i), else resample from p_i with x_i removed.

Greedy is the temperature-0 limit: accept x_i while x_i == argmax p_i; emit argmax p at the first
mismatch (or argmax p_{k+1} when all agree).

Randomness enters only through the explicit ``generator``; exactly k uniforms and then one
categorical draw are consumed per call, so results are reproducible.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Verdict(NamedTuple):
    """n_accepted: how many leading draft tokens survive (0..k); next_token: the target's token
    that follows them (the correction at the first rejection, or the bonus token)."""

    n_accepted: int
    next_token: int


def _leading_true(mask: torch.Tensor) -> int:
    """Number of leading True values in a 1-D bool tensor."""
    if mask.numel() == 0:
        return 0
    return int(mask.long().cumprod(dim=0).sum())


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """draft_tokens: [k] long; target_logits: [k+1, V]. Returns the greedy verdict."""
    k = draft_tokens.shape[0]
    target_choice = target_logits.argmax(dim=-1)  # [k+1]
    n = _leading_true(target_choice[:k] == draft_tokens)
    return Verdict(n, int(target_choice[n]))


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Leviathan et al.'s rejection rule.

    draft_tokens: [k] long. draft_probs: [k, V] (q) or None for a deterministic drafter
    (q_i = one_hot(x_i)). target_probs: [k+1, V] (p), already temperature/top-k/top-p processed.
    """
    k = draft_tokens.shape[0]
    rows = torch.arange(k)
    p_x = target_probs[rows, draft_tokens]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs[rows, draft_tokens]
    u = torch.rand(k, generator=generator, dtype=p_x.dtype)
    # u < p/q written without division: q_x > 0 for any token the drafter actually proposed.
    n = _leading_true(u * q_x < p_x)
    if n == k:
        residual = target_probs[k]
    else:
        if draft_probs is None:
            residual = target_probs[n].clone()
            residual[draft_tokens[n]] = 0.0
        else:
            residual = (target_probs[n] - draft_probs[n]).clamp_min(0.0)
        total = residual.sum()
        # p <= q everywhere with p != q cannot happen for true distributions; with rounding it
        # can leave ~0 mass, and then p itself is the right fallback.
        residual = residual / total if total > 1e-12 else target_probs[n]
    y = torch.multinomial(residual, 1, generator=generator)
    return Verdict(n, int(y))
