"""A runner (engine.models.runners.interface) on transformers' own modules and cache: any
architecture transformers runs, on any device torch has.

Drafters that read the target itself (Gemma 4 assistants, in-checkpoint MTP layers) set
``capture_hidden``: each forward then also keeps the final (post-norm) hidden states of the rows
the model computed, and ``hidden_at`` / ``cached_kv`` hand out what such a drafter needs.
EAGLE-3 drafters set ``aux_layers``: each forward keeps the inputs of those decoder layers
(engine.models.runners.aux_states).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from engine.models.runners.aux_states import LayerInputs
from engine.models.runners.interface import ContextTooLong


class ModelRunner:
    def __init__(self, model) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        # Multimodal wrappers (Gemma4ForConditionalGeneration) keep the window in the text config.
        self.max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        #: Keep the final hidden states of every forward (set by drafters that read them).
        self.capture_hidden = False
        #: Decoder layers whose inputs every forward keeps (set by drafters that read them).
        self.aux_layers: tuple[int, ...] = ()
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        #: The token at each cached position; None where it was fed as a device tensor (not read
        #: back to the host for this), which no later prompt matches (engine.models.runners.prefix_reuse).
        self.tokens: list[int | None] = []
        self.hidden: torch.Tensor | None = None  # [rows, H]: final hidden states of the last pass
        self.hidden_start = 0  # absolute position of hidden[0]
        self.aux: torch.Tensor | None = None  # [rows, len(aux_layers) * H] of the last pass
        self.aux_start = 0
        # Sliding-window layers forget states beyond the window as they go, which a rollback
        # could not undo; recording keeps them until the next pass trims them (see forward).
        self._sliding = any(getattr(layer, "is_sliding", False) for layer in self.cache.layers)
        if self._sliding:
            self.cache.activate_past_recording()

    @torch.inference_mode()
    def forward(self, token_ids: list[int] | torch.Tensor, n_logits: int = 1) -> torch.Tensor:
        """Feed ``token_ids`` after the cached ones; return float32 logits [n_logits, V] for the
        last ``n_logits`` fed positions (logits at position j predict the token after j).
        ``token_ids`` may be a 1-D long tensor already on the device (a drafter feeding back its
        own token without reading it on the host)."""
        out = self._run(self.model, token_ids, logits_to_keep=n_logits)
        return out.logits[0, -n_logits:].float()

    @torch.inference_mode()
    def forward_hidden(self, token_ids: list[int], n_last: int = 1) -> torch.Tensor:
        """Like ``forward`` but stop before the LM head: the final (normed) hidden states
        [n_last, H] of the last fed positions, for a caller that applies its own head."""
        out = self._run(self.model.get_decoder(), token_ids)
        return out.last_hidden_state[0, -n_last:]

    def _run(self, module, token_ids: list[int] | torch.Tensor, **kwargs):
        n = len(token_ids)
        if n == 0:
            raise ValueError("nothing to feed")
        if self.max_positions and self.length + n > self.max_positions:
            raise ContextTooLong(
                f"context of {self.length + n} tokens exceeds the model's window of "
                f"{self.max_positions}"
            )
        if self._sliding and self.length:
            # The previous pass is final now: sliding layers may drop what the window no longer
            # needs (crop(0) keeps every position, it only trims recorded sliding states).
            self.cache.crop(0)
        if isinstance(token_ids, torch.Tensor):
            input_ids = token_ids.to(device=self.device, dtype=torch.long).view(1, n)
        else:
            input_ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        positions = torch.arange(self.length, self.length + n, device=self.device)
        hook = None
        if self.capture_hidden:
            hook = self._final_norm().register_forward_hook(self._keep_hidden)
        else:
            self.hidden = None
        taps = LayerInputs(self.model.get_decoder(), self.aux_layers) if self.aux_layers else None
        try:
            out = module(
                input_ids=input_ids,
                cache=self.cache,
                use_cache=True,
                position_ids=positions.unsqueeze(0),
                **kwargs,
            )
        finally:
            if hook is not None:
                hook.remove()
            if taps is not None:
                taps.remove()
        if taps is not None:
            self.aux = taps.rows()
            self.aux_start = self.length + n - self.aux.shape[0]
        if hook is not None:
            # The model may compute only the last rows (Gemma 4 skips KV-shared layers for rows
            # whose logits are not kept); whatever it computed ends at the last fed position.
            self.hidden_start = self.length + n - self.hidden.shape[0]
        if isinstance(token_ids, torch.Tensor):
            self.tokens.extend([None] * n)
        else:
            self.tokens.extend(int(t) for t in token_ids)
        self.length += n
        return out

    @property
    def can_crop(self) -> bool:
        """Whether any cached prefix can be kept: sliding-window layers drop states beyond their
        window as they go, so only the whole cache (a request that extends it) can be."""
        return not self._sliding

    @property
    def kv_bytes(self) -> int:
        """Memory its key/value cache holds (what a pool of kept caches budgets)."""
        total = 0
        for layer in self.cache.layers:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total

    def crop(self, length: int) -> None:
        """Forget cached positions from ``length`` on (no-op when already shorter)."""
        if length < self.length:
            self.cache.crop(length - self.length)  # transformers 5.24: negative = drop that many
            self.length = length
            del self.tokens[length:]

    def hidden_at(self, position: int) -> torch.Tensor:
        """Final hidden state [H] of the token at ``position`` (must be cached and computed by
        the latest pass; needs ``capture_hidden``)."""
        row = position - self.hidden_start
        if self.hidden is None or not 0 <= row < self.hidden.shape[0] or position >= self.length:
            raise RuntimeError(f"no hidden state kept for position {position}")
        return self.hidden[row]

    def cached_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [1, kv_heads, n, head_dim] that decoder layer ``layer`` cached for the
        last n positions of the sequence (all of them, or at least the window of a sliding
        layer); the last row is position ``length - 1``."""
        cached = self.cache.layers[layer]
        return cached.keys, cached.values

    def _final_norm(self) -> torch.nn.Module:
        return self.model.get_decoder().norm

    def _keep_hidden(self, module, args, output) -> None:
        self.hidden = output[0]
