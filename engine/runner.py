"""One causal LM and its KV cache for a single sequence: forward new tokens, roll back.

Invariant kept by the decoding loops: the cache holds every token of the sequence except the
last one, which has been chosen but not yet fed. ``forward`` appends, ``crop`` rolls back.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


class ContextTooLong(ValueError):
    pass


class ModelRunner:
    def __init__(self, model) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    @torch.inference_mode()
    def forward(self, token_ids: list[int], n_logits: int = 1) -> torch.Tensor:
        """Feed ``token_ids`` after the cached ones; return float32 logits [n_logits, V] for the
        last ``n_logits`` fed positions (logits at position j predict the token after j)."""
        out = self._run(self.model, token_ids, logits_to_keep=n_logits)
        return out.logits[0, -n_logits:].float()

    @torch.inference_mode()
    def forward_hidden(self, token_ids: list[int], n_last: int = 1) -> torch.Tensor:
        """Like ``forward`` but stop before the LM head: the final (normed) hidden states
        [n_last, H] of the last fed positions, for a caller that applies its own head."""
        out = self._run(self.model.get_decoder(), token_ids)
        return out.last_hidden_state[0, -n_last:]

    def _run(self, module, token_ids: list[int], **kwargs):
        n = len(token_ids)
        if n == 0:
            raise ValueError("nothing to feed")
        if self.max_positions and self.length + n > self.max_positions:
            raise ContextTooLong(
                f"context of {self.length + n} tokens exceeds the model's window of "
                f"{self.max_positions}"
            )
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        positions = torch.arange(self.length, self.length + n, device=self.device)
        out = module(
            input_ids=input_ids,
            cache=self.cache,
            use_cache=True,
            position_ids=positions.unsqueeze(0),
            **kwargs,
        )
        self.length += n
        return out

    def crop(self, length: int) -> None:
        """Forget cached positions from ``length`` on (no-op when already shorter)."""
        if length < self.length:
            self.cache.crop(length - self.length)  # transformers 5.24: negative = drop that many
            self.length = length
