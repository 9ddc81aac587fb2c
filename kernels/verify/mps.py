"""Verification as a handful of vectorised torch ops on the tensors' own device (Apple MPS).

Same decision as the reference, with no Python loop over draft positions and no host sync until
the verdict is read (one ``tolist()`` of two integers). Positions are handled with masks instead
of ``if`` on device values: the first rejection is min(index where rejected, k), the residual row
is picked with ``index_select``, the fallback and the bonus row with ``where``.

Why not a Metal shader: the work is k <= 16 gathers plus a few elementwise passes and two
argmaxes over one V-long row (~0.6 MB at V = 151,936), i.e. memory-bound and launch-bound; a
custom shader would save a few kernel launches (~10 us each on MPS) against a target pass of
tens of milliseconds, and would bring a compile step into a pure-Python app. Not measured on a
Mac here (none available); the claim is to be checked with ``engine.bench.gpu_bench`` on one.

Nothing here is MPS-specific, so the parity tests run it on CPU tensors too.
"""
from __future__ import annotations

import torch

from kernels.verify import reference
from kernels.verify.reference import Verdict


def _first_true_or(mask: torch.Tensor, default: int) -> torch.Tensor:
    """0-d long tensor: index of the first True in ``mask`` [k], or ``default`` if none."""
    idx = torch.arange(mask.shape[0], device=mask.device)
    fill = torch.full_like(idx, default)
    return torch.where(mask, idx, fill).min() if mask.numel() else torch.tensor(default, device=mask.device)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """draft_tokens: [k] long; target_logits: [k+1, V]."""
    k = draft_tokens.shape[0]
    choice = target_logits.argmax(dim=-1)  # [k+1]
    n = _first_true_or(choice[:k] != draft_tokens.to(choice.device), k)
    nxt = choice.index_select(0, n.view(1))[0]
    n_host, next_host = torch.stack([n, nxt]).tolist()  # the one sync
    return Verdict(n_host, next_host)


def _decide(s: reference.Sampled) -> Verdict:
    """reference.decide with masks instead of branches (module docstring)."""
    p, q, x = s.p, s.q, s.x
    dev = p.device
    k, vocab = x.shape[0], p.shape[-1]
    rows = torch.arange(k, device=dev)
    p_x = p[rows, x]
    q_x = torch.ones_like(p_x) if q is None else q[rows, x]
    accepted = s.u * q_x < p_x
    n = _first_true_or(~accepted, k)  # 0-d, in 0..k
    p_n = p.index_select(0, n.view(1))[0]  # [V]: the rejected row, or p_{k+1} when n == k
    if k == 0:
        residual = p_n
    else:
        before_end = (n < k).to(p.dtype)  # 1.0 at a rejection, 0.0 when all were accepted
        safe_n = n.clamp_max(k - 1).view(1)
        if q is None:
            x_n = x.index_select(0, safe_n)  # the rejected token (ignored when n == k)
            drop = (torch.arange(vocab, device=dev) == x_n) & (n < k)
            residual = torch.where(drop, torch.zeros_like(p_n), p_n)
        else:
            # q_n * 0.0 == 0.0 exactly, so at n == k this is max(0, p_{k+1}) = p_{k+1}.
            residual = (p_n - q.index_select(0, safe_n)[0] * before_end).clamp_min(0.0)
    keys = residual * s.w
    fallback = p_n * s.w
    y = torch.where(keys.max() > 0, keys.argmax(), fallback.argmax())
    n_host, y_host = torch.stack([n, y]).tolist()  # the one sync
    return Verdict(n_host, y_host)


sampled_verdict, verify_sampled = reference.sampled_backend(_decide)
