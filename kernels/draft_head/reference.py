r"""Specification of a reduced ("pruned") drafter LM head.

A drafter's LM head maps its last hidden state h [n, H] to one logit per vocabulary token,
z = h W^T with W [V, H]; for a 0.5B drafter and a 151,936-token vocabulary that matmul is a
large share of a draft step. A reduced head keeps only the rows of a token subset
``ids`` [S] (distinct vocabulary ids), optionally stored as int8 rows with per-row scales:

    z_sub[n, s] = h[n] . W[ids[s]]                 (fp32; W[ids[s]] = q[s] * scale[s] if int8)

Drafting from it: greedy proposes ids[argmax_s z_sub]; sampling draws s ~ q_sub (the processed
softmax of z_sub) and proposes ids[s]. A token outside the subset is never proposed. As a
distribution over the whole vocabulary the drafter's q is q_sub scattered back, zero elsewhere:

    q[v] = q_sub[s] if v == ids[s], else 0

which is what verification must be given: it accepts x with prob min(1, p(x)/q(x)) and resamples
from norm(max(0, p - q)), so the target's law is kept whatever the subset is.
"""
from __future__ import annotations

import torch


def subset_logits(
    hidden: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """hidden [..., H]; weight [S, H] (float rows, or int8 rows with ``scale`` [S] fp32).
    Returns fp32 logits [..., S]."""
    w = weight.float() if scale is None else weight.float() * scale[:, None]
    return hidden.float() @ w.t()


def to_vocab(values: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Scatter [..., S] values of the subset back to [..., vocab_size], zero elsewhere."""
    out = values.new_zeros(*values.shape[:-1], vocab_size)
    return out.index_copy_(-1, ids, values)


def greedy_ids(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The vocabulary id of each row's best subset logit: [..., S] -> [...]."""
    return ids[logits.argmax(dim=-1)]
