"""What a user chooses for one generation request."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["greedy", "sample"]
# exact: fp32 (greedy speculation token-identical to plain); fast: bf16/fp16; int8: the target's
# linear weights quantized to int8 (smaller and faster on a CPU, output slightly different from
# bf16; speculation on it stays token-identical to plain decoding of the same int8 target);
# int4: 4-bit weights with int8-quantized inputs per layer (llama.cpp's Q4_1 x Q8_1 recipe;
# smaller and faster still, output further from bf16; speculation on it stays token-identical).
# file: a GGUF target's own quantization, computed from the file's blocks (engine.gguf; fp32
# activations, quantized per block as llama.cpp does; speculation stays token-identical).
Precision = Literal["exact", "fast", "int8", "int4", "file"]
PRECISIONS: tuple[str, ...] = ("exact", "fast", "int8", "int4", "file")
DraftHead = Literal["pruned", "full"]
DrafterPrecision = Literal["auto", "int8", "int4", "bf16", "fp32"]

# Tokens kept by a pruned drafter head. Measured on the default pair (teacher-forced greedy
# agreement with the target's own outputs on the bench prompts, int8 drafter): full head 0.877;
# 8k 0.828, 16k 0.848, 32k 0.871, 48k 0.873. 32k loses little, and its int8 rows (29 MB) are a
# fifth of the full head's.
DEFAULT_DRAFT_VOCAB = 32768

# Stop a draft early once the drafter doubts its next token (see DrafterOptions): its last tokens
# are the ones verification rejects, and each costs a draft step and a verified row. Measured on
# the default pair (bench prompts, code/rewrite/prose, same run): geometric mean speedup 1.67x
# at 0 vs 1.73x at 0.4, better or equal on every prompt where the drafts differed.
DEFAULT_MIN_CONFIDENCE = 0.4

# Longest draft a request may ask for. Verification then covers at most 33 rows, within the
# batch-invariant attention's reach (engine.models.invariant_attention.PREFILL_ROWS), and far past any
# length that pays: the adaptive choice rarely goes beyond 8.
MAX_DRAFT_LENGTH = 32


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
        if self.draft_length is not None and not 0 <= self.draft_length <= MAX_DRAFT_LENGTH:
            raise ValueError(f"draft_length must be between 0 and {MAX_DRAFT_LENGTH}")
        if not 1 <= self.max_draft_length <= MAX_DRAFT_LENGTH:
            raise ValueError(f"max_draft_length must be between 1 and {MAX_DRAFT_LENGTH}")


@dataclass(frozen=True)
class DrafterOptions:
    """How a draft model is loaded. None of it affects what the target accepts, only the cost of a
    draft step and how often drafts agree with the target.

    head "pruned" scores only ``vocab_size`` frequent tokens (engine.drafters.draft_vocab) plus the
    request's own tokens; "full" scores the whole vocabulary. precision "auto" is int8 weights
    where a fast int8 kernel runs (CPU; int4 next to an int8 / int4 target, see
    engine.models.loading.drafter_weights), else the target's dtype; "int8", "int4", "bf16", "fp32" force one.
    ``min_confidence``: a draft stops early once the drafter's own probability of its next token
    falls below this (0 drafts the full length the controller asks for).
    ``lookup``: let prompt lookup draft instead of the model where the request copies itself
    (engine.drafters.lookup_first); False drafts with the model alone.
    """

    head: DraftHead = "pruned"
    precision: DrafterPrecision = "auto"
    vocab_size: int = DEFAULT_DRAFT_VOCAB
    min_confidence: float = DEFAULT_MIN_CONFIDENCE
    lookup: bool = True

    def __post_init__(self) -> None:
        if self.head not in ("pruned", "full"):
            raise ValueError(f"drafter head must be 'pruned' or 'full', not {self.head!r}")
        if self.precision not in ("auto", "int8", "int4", "bf16", "fp32"):
            raise ValueError(f"drafter precision must be auto, int8, int4, bf16 or fp32, not {self.precision!r}")
        if self.vocab_size < 1:
            raise ValueError("vocab_size must be >= 1")
        if not 0 <= self.min_confidence < 1:
            raise ValueError("min_confidence must be in [0, 1)")
