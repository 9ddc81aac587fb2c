r"""Pure-torch reference for draft verification. This file IS the specification.

Notation (Leviathan et al. 2023, arXiv 2211.17192): **p = target distribution, q = draft
distribution**. The drafter proposed tokens x_1..x_k, x_i ~ q_i. One target pass over
(context, x_1..x_k) gives p_1..p_{k+1}, where p_i is the target's distribution for position i.

Sampling rule, for i = 1..k in order:
    draw u_i ~ U[0, 1); accept x_i iff u_i * q_i(x_i) < p_i(x_i)   (i.e. with prob min(1, p/q))
    at the first rejection i: emit y ~ norm(max(0, p_i - q_i)) and stop.
If all k are accepted, emit a bonus token y ~ p_{k+1}.
The emitted sequence (accepted drafts, then y) is distributed exactly as k+1 tokens sampled
from the target alone would be, whatever q is. A deterministic drafter (prompt lookup) is the
case q_i = one_hot(x_i): accept with prob p_i(x_i), else resample from p_i with x_i removed.

Greedy is the temperature-0 limit: accept x_i while x_i == argmax p_i; emit argmax p at the first
mismatch (or argmax p_{k+1} when all agree). Ties go to the lowest token id (torch.argmax).

Randomness. Every random number a verification consumes is drawn up front by
``draw_randomness`` from the explicit ``generator``: k acceptance uniforms and one race weight
per vocabulary entry. The categorical draw y ~ norm(r) is an *exponential race*: with
E_j ~ Exp(1) i.i.d., argmax_j r_j / E_j is j with probability r_j / sum(r) (the first of
independent exponential clocks with rates r_j to ring), so no normalisation, no prefix sum and
no data-dependent amount of randomness is needed. torch.multinomial on CUDA samples the same
way. Because the decision is then elementwise IEEE products, comparisons and an argmax with
lowest-index ties, every backend that is handed the same ``Randomness`` returns the same
verdict bit for bit, whatever order it reduces in. The race weights are 1/E in float32, each E
drawn in float64: float32 uniforms (steps of 2^-24) would give each of 151,936 tokens an extra
~6e-8 chance of an E = 0 win, ~1% of the mass in all.

Where the generator is a CPU one, the E come from numpy's ziggurat (``standard_exponential``,
float64, exact up to float64 rounding) on a PCG64 stream seeded by one 63-bit draw of the
generator: 0.74 ms for 151,936 weights on 2 cores of an AVX-512 EPYC, where torch's CPU
generator draws float64 uniforms one at a time (0.8 ms of the old 1.77 with their log1p,
reciprocal and narrowing), once per sampled pass that drafts. The generator still decides every
draw (the seed is its next number: the same generator state, the same weights); the stream is
not torch.rand's. A CUDA generator keeps drawing uniforms on the device (no host work).

Probabilities are float32 (what kernels.sampling.process_logits returns); other dtypes are
converted first.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

# 1/E stays finite (E >= 2^-64; a float64 uniform of 0 reaches it with probability 2^-53 per
# token, numpy's exponentials far more rarely) so keys r * w never become inf or NaN.
_MIN_EXPONENTIAL = 2.0**-64


class Verdict(NamedTuple):
    """n_accepted: how many leading draft tokens survive (0..k); next_token: the target's token
    that follows them (the correction at the first rejection, or the bonus token)."""

    n_accepted: int
    next_token: int


class Randomness(NamedTuple):
    """accept_u: [k] float32 uniforms in [0, 1) for the acceptance tests.
    race: [V] float32 weights 1/E_j, E_j ~ Exp(1), for the categorical draw argmax_j r_j * w_j."""

    accept_u: torch.Tensor
    race: torch.Tensor


def draw_randomness(k: int, vocab: int, generator: torch.Generator | None, device: torch.device | str | None = None) -> Randomness:
    """Everything one sampled verification consumes, in a fixed order: k float32 uniforms, then
    the ``vocab`` race weights (from a CPU generator: one seed for their exponentials, see the
    module docstring; from a CUDA one: ``vocab`` float64 uniforms). Drawn on the generator's
    device (CPU when None: the default CPU generator), returned on ``device``.

    A CUDA generator keeps the draw on the GPU (no host work per step); an MPS generator is
    refused because MPS has no float64 (use a CPU generator there)."""
    where = generator.device if generator is not None else torch.device("cpu")
    if where.type == "mps":
        raise ValueError("draw verification randomness with a CPU or CUDA generator (MPS has no float64)")
    accept_u = torch.rand(k, generator=generator, dtype=torch.float32, device=where)
    if where.type == "cpu":
        exponential = torch.from_numpy(_exponentials(vocab, generator))
    else:
        u = torch.rand(vocab, generator=generator, dtype=torch.float64, device=where)
        exponential = torch.log1p(-u).neg_()  # u in [0, 1): E in [0, 37]
    race = exponential.clamp_min_(_MIN_EXPONENTIAL).reciprocal_().float()
    if device is not None:
        accept_u, race = accept_u.to(device), race.to(device)
    return Randomness(accept_u, race)


def _exponentials(count: int, generator: torch.Generator | None) -> np.ndarray:
    """``count`` float64 draws of Exp(1) from a numpy stream that ``generator``'s next number seeds."""
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
    return np.random.Generator(np.random.PCG64(seed)).standard_exponential(count)


def _leading_true(mask: torch.Tensor) -> int:
    """Number of leading True values in a 1-D bool tensor."""
    if mask.numel() == 0:
        return 0
    return int(mask.long().cumprod(dim=0).sum())


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """draft_tokens: [k] long; target_logits: [k+1, V]. Returns the greedy verdict."""
    k = draft_tokens.shape[0]
    target_choice = target_logits.argmax(dim=-1)  # [k+1]
    n = _leading_true(target_choice[:k] == draft_tokens.to(target_choice.device))
    return Verdict(n, int(target_choice[n]))


def race(weights: torch.Tensor, race_w: torch.Tensor) -> int | None:
    """Index of the largest weights[j] * race_w[j] (lowest index on ties): a draw from
    norm(weights). None when no entry has positive key (no mass to sample from)."""
    keys = weights * race_w
    if not bool(keys.max() > 0):
        return None
    return int(keys.argmax())


class Sampled(NamedTuple):
    """A sampled verification's inputs, on the target's device: p [k+1, V] and q [k, V] (None
    for a deterministic drafter) in float32, the drafts x [k], and the random numbers (u: the
    acceptance uniforms [k], w: the race weights [V])."""

    p: torch.Tensor
    q: torch.Tensor | None
    x: torch.Tensor
    u: torch.Tensor
    w: torch.Tensor


def sampled_backend(decide):
    """``(sampled_verdict, verify_sampled)`` for a backend whose ``decide(Sampled) -> Verdict``
    applies the rule: every backend takes the same arguments and puts them on the target's
    device the same way, and draws its random numbers with ``draw_randomness``."""

    def sampled_verdict(
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        randomness: Randomness,
    ) -> Verdict:
        """The rejection rule given its random numbers (see ``draw_randomness``).

        draft_tokens: [k] long. draft_probs: [k, V] (q) or None for a deterministic drafter
        (q_i = one_hot(x_i)). target_probs: [k+1, V] (p), already temperature/top-k/top-p
        processed.
        """
        p = target_probs.float()
        q = None if draft_probs is None else draft_probs.float()
        dev = p.device
        return decide(Sampled(p, q, draft_tokens.to(dev), randomness.accept_u.to(dev), randomness.race.to(dev)))

    def verify_sampled(
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        generator: torch.Generator | None,
    ) -> Verdict:
        """Leviathan et al.'s rejection rule, drawing its random numbers from ``generator``."""
        draws = draw_randomness(draft_tokens.shape[0], target_probs.shape[-1], generator, target_probs.device)
        return sampled_verdict(draft_tokens, draft_probs, target_probs, draws)

    return sampled_verdict, verify_sampled


def decide(s: Sampled) -> Verdict:
    """The sampled rule itself (the specification: module docstring), on prepared inputs."""
    p, q, x = s.p, s.q, s.x
    k = x.shape[0]
    rows = torch.arange(k, device=p.device)
    p_x = p[rows, x]
    q_x = torch.ones_like(p_x) if q is None else q[rows, x]
    # u < p/q written without division: q_x > 0 for any token the drafter actually proposed.
    n = _leading_true(s.u * q_x < p_x)
    if n == k:
        residual = p[k]
    elif q is None:
        residual = p[n].clone()
        residual[x[n]] = 0.0
    else:
        residual = (p[n] - q[n]).clamp_min(0.0)
    y = race(residual, s.w)
    if y is None:
        # p <= q everywhere with p != q cannot happen for true distributions; rounding can leave
        # no mass at all, and then p itself is the right fallback.
        y = race(p[n], s.w)
    return Verdict(n, 0 if y is None else y)


sampled_verdict, verify_sampled = sampled_backend(decide)
