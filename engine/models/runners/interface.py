"""What decoding asks of a model: one interface every runner implements.

A runner is one causal LM with its KV cache for a single sequence. The decoding loops keep one
invariant: the cache holds every token of the sequence except the last, which has been chosen
but not yet fed; ``forward`` appends, ``crop`` rolls back. Prefix reuse (engine.models.runners.
prefix_reuse) reads ``tokens`` and ``can_crop`` to keep what a new request shares with the last.

The runners: ModelRunner (transformers' modules and cache, any architecture), GgufRunner (a
GGUF file's quantized rows through kernels/gguf_linear), FusedRunner (a small drafter's layers
through the int8/int4 CPU kernels). ``tests/engine/models/runners/test_runner_interface.py``
checks that each is one.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


class ContextTooLong(ValueError):
    """The sequence would outgrow the model's window (a ValueError: the message is the user's)."""


@runtime_checkable
class Runner(Protocol):
    #: The model whose layers it runs (its config and name; its modules for transformers' path).
    model: torch.nn.Module
    #: The model's context window in tokens (None where its config does not say).
    max_positions: int | None
    #: Positions cached.
    length: int
    #: The token at each cached position (None where it was fed as a device tensor).
    tokens: list

    @property
    def can_crop(self) -> bool:
        """Whether any cached prefix can be kept (sliding-window layers forget as they go)."""

    @property
    def kv_bytes(self) -> int:
        """Memory the KV cache holds (what a pool of kept caches budgets)."""

    def reset(self) -> None:
        """Forget the sequence."""

    def forward(self, token_ids: list[int] | torch.Tensor, n_logits: int = 1) -> torch.Tensor:
        """Feed ``token_ids`` after the cached ones; float32 logits [n_logits, V] of the last
        ``n_logits`` fed positions (those at position j predict the token after j)."""

    def forward_hidden(self, token_ids: list[int] | torch.Tensor, n_last: int = 1) -> torch.Tensor:
        """Like ``forward`` but stop before the LM head: the final (normed) hidden states
        [n_last, H] of the last fed positions, for a caller with its own head."""

    def crop(self, length: int) -> None:
        """Forget cached positions from ``length`` on (no-op when already shorter)."""
