"""Route a CPU target's attention through kernels.attention, so that verifying k+1 tokens gives
bit-identical results to decoding them one at a time.

Why: with batch-invariant linear layers (kernels.linear, kernels.quant_linear) attention was the
one part of a bf16 forward whose per-row result changed with the number of rows (measured on the
default pair: every layer's inputs identical, the attention outputs not). The differences are
rounding-sized, but at a near-tie between the two likeliest tokens they flip greedy decoding, so
without this, speculation in bf16 could change the text. With it, it never does.

Prompt prefill (more than ``PREFILL_ROWS`` new rows) keeps PyTorch's SDPA: plain and speculative
decoding prefill a prompt the same way, and verification never has that many rows
(engine.core.settings.MAX_DRAFT_LENGTH bounds the draft length).
"""
from __future__ import annotations

import logging

from engine.core.settings import MAX_DRAFT_LENGTH
from engine.models.planning.architecture import plain_causal_reason
from kernels import attention

log = logging.getLogger(__name__)

NAME = "tandem_batch_invariant"
PREFILL_ROWS = 64
assert MAX_DRAFT_LENGTH + 1 <= PREFILL_ROWS, "verification must stay on the batch-invariant kernel"


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    if query.shape[0] != 1 or query.shape[2] > PREFILL_ROWS:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else module.head_dim ** -0.5
    return attention.causal_attention(query, key, value, scale), None


def unsupported_reason(model) -> str | None:
    reason = plain_causal_reason(model.config)
    if reason is not None:
        return reason
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    if attention.fast_backend() is None:
        return "no compiled attention kernel here"
    return None


def use_batch_invariant_attention(model) -> bool:
    """Switch ``model`` (a single-sequence causal LM on the CPU) to the batch-invariant kernel
    for decoding and verification; False (model unchanged) where it does not apply."""
    reason = unsupported_reason(model)
    if reason is not None:
        log.info("attention stays PyTorch's: %s", reason)
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    # transformers builds no mask for an attention it does not know, and SDPA then takes
    # is_causal, which aligns the causal mask top-left: a prefill of more than PREFILL_ROWS rows
    # after cached ones (a chat's next turn) would see only the first keys. SDPA's own mask
    # builder gives it the right one (and none where is_causal alone is right).
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.config._attn_implementation = NAME
    return True
