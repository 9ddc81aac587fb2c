"""What the runners that compute a decoder's layers themselves (engine.models.runners.fused_runner's
FusedRunner, engine.models.runners.gguf_runner's GgufRunner) share: the decoder's geometry read from its
config, their own key/value cache (engine.models.runners.kv_buffers), and that cache's bookkeeping
(reset, crop, the model's context window). Each runner adds its layers and forward passes."""
from __future__ import annotations

import torch

from engine.models.runners.interface import ContextTooLong
from engine.models.runners.kv_buffers import KVBuffers


class OwnCacheRunner:
    def __init__(self, model) -> None:
        config, decoder = model.config, model.get_decoder()
        self.model = model
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.eps = float(config.rms_norm_eps)
        self.final_norm = decoder.norm.weight.float()
        self.inv_freq = decoder.rotary_emb.inv_freq.float()
        self.rope_scale = float(getattr(decoder.rotary_emb, "attention_scaling", 1.0))
        self.length = 0
        #: The token at each cached position (engine.models.runners.prefix_reuse reads it).
        self.tokens: list[int] = []
        #: Layers whose inputs each forward keeps in ``aux`` [rows, len * H], for an EAGLE-3
        #: drafter (engine.drafters.eagle3); the runners that compute their own layers fill it.
        self.aux_layers: tuple[int, ...] = ()
        self.aux: torch.Tensor | None = None
        self.aux_start = 0

    def _allocate_cache(self, layers: int, head_dim: int, capacity: int, dtype: torch.dtype = torch.float32) -> None:
        self.head_dim = head_dim
        self.kv = KVBuffers(layers, self.n_kv, head_dim, capacity, dtype)

    def reset(self) -> None:
        self.length = 0
        self.tokens = []

    def crop(self, length: int) -> None:
        """Forget cached positions from ``length`` on (no-op when already shorter)."""
        self.length = min(self.length, length)
        del self.tokens[self.length :]

    #: Any cached prefix can be kept: a crop only moves the length (engine.models.runners.prefix_reuse).
    can_crop = True

    @property
    def kv_bytes(self) -> int:
        """Memory its key/value cache holds (what a pool of kept caches budgets)."""
        return self.kv.k.numel() * self.kv.k.element_size() * 2

    def _record(self, start: int, token_ids) -> None:
        """The rows fed at ``start`` are cached now: note their tokens, and the new length."""
        ids = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)
        del self.tokens[start:]
        self.tokens.extend(int(t) for t in ids)
        self.length = start + len(ids)

    def _new_positions(self, n: int) -> tuple[int, int]:
        """(start, end) of ``n`` rows fed after the cached ones, with cache room for them."""
        if n == 0:
            raise ValueError("nothing to feed")
        start, end = self.length, self.length + n
        if self.max_positions and end > self.max_positions:
            raise ContextTooLong(f"context of {end} tokens exceeds the model's window of {self.max_positions}")
        self.kv.ensure(end)
        return start, end
