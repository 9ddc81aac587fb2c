"""What a user chooses for one generation request."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["greedy", "sample"]
Precision = Literal["exact", "fast"]


@dataclass(frozen=True)
class DecodeSettings:
    """mode greedy is deterministic; sample uses temperature / top_k / top_p with ``seed``.

    draft_length None lets the engine choose k per step from measured costs and acceptance;
    an int fixes it (0 = never draft). max_draft_length bounds the adaptive choice.
    """

    mode: Mode = "greedy"
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop_strings: tuple[str, ...] = ()
    seed: int = 0
    draft_length: int | None = None
    max_draft_length: int = 8

    def __post_init__(self) -> None:
        if self.mode not in ("greedy", "sample"):
            raise ValueError(f"mode must be 'greedy' or 'sample', not {self.mode!r}")
        if self.mode == "sample" and self.temperature <= 0:
            raise ValueError("temperature must be > 0 when sampling (use greedy for 0)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if self.draft_length is not None and self.draft_length < 0:
            raise ValueError("draft_length must be >= 0")
        if self.max_draft_length < 1:
            raise ValueError("max_draft_length must be >= 1")
