"""What a user chooses for one generation request, and the checks every front end shares.

The CLI, the app and a server build DecodeSettings and pass prompts through ``check_prompt``
before anything is loaded, so a bad request is refused in milliseconds, with one message, the
same way everywhere. Those errors are ``InvalidRequest`` (a ValueError): the CLI prints the
message alone and exits with status 2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


class InvalidRequest(ValueError):
    """A request the user can fix (an empty prompt, a temperature of nan, ...)."""


#: Prompt rows per prefill pass (the target's and a draft model's): a long prompt shows progress
#: and can be cancelled between chunks, and a chunk's activations stay small (the memory fit
#: budgets one chunk's, engine.models.planning.memory_fit). The runners' rows are batch-invariant, so the
#: chunking changes no bit of the cache (engine.models.runners.gguf_runner).
PREFILL_CHUNK = 256

# torch.Generator.manual_seed takes any 64-bit pattern; negative seeds alias large ones.
MAX_SEED = 2**64 - 1


def check_prompt(prompt: str, what: str = "the prompt") -> str:
    """``prompt`` if a model can take it, else InvalidRequest: it must be text, hold more than
    white space and be valid UTF-8 (bytes that are not arrive from argv or a file as lone
    surrogates, which the tokenizer refuses with a cryptic TypeError)."""
    if not isinstance(prompt, str):
        raise InvalidRequest(f"{what} must be text, not {type(prompt).__name__}")
    if not prompt.strip():
        raise InvalidRequest(f"{what} is empty: type something to send")
    return _check_utf8(prompt, what)


def _check_utf8(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        # surrogateescape maps an undecodable byte b to the lone surrogate U+DC00 + b
        shown = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise InvalidRequest(f"{what} is not valid UTF-8 ({shown} at character {exc.start + 1})") from None
    return text


def _finite(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number, not {value!r}")
    return value


def _whole(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be a whole number, not {value!r}")
    return value

Mode = Literal["greedy", "sample"]
# fp32: greedy speculation token-identical to plain; bf16 (fp16 on a Mac): half the bytes; int8: the target's
# linear weights quantized to int8 (smaller and faster on a CPU, output slightly different from
# bf16; speculation on it stays token-identical to plain decoding of the same int8 target);
# int4: 4-bit weights with int8-quantized inputs per layer (llama.cpp's Q4_1 x Q8_1 recipe;
# smaller and faster still, output further from bf16; speculation on it stays token-identical).
# file: a GGUF target's own quantization, computed from the file's blocks (engine.gguf; fp32
# activations, quantized per block as llama.cpp does; speculation stays token-identical).
Precision = Literal["file", "bf16", "fp32", "int8", "int4"]
PRECISIONS: tuple[str, ...] = ("file", "bf16", "fp32", "int8", "int4")
#: Earlier names of two precisions, still accepted wherever a precision is read (the CLI, saved
#: settings, API calls): "fast" was bf16 and "exact" fp32.
PRECISION_ALIASES = {"fast": "bf16", "exact": "fp32"}


def precision_name(value: str) -> str:
    """``value`` in the one precision vocabulary (an old spelling mapped); a ValueError naming
    the choices for anything else."""
    name = PRECISION_ALIASES.get(value, value)
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {value!r}; choose from {', '.join(PRECISIONS)}")
    return name
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
# batch-invariant attention's reach (engine.models.runners.invariant_attention.PREFILL_ROWS), and far past any
# length that pays: the adaptive choice rarely goes beyond 8.
MAX_DRAFT_LENGTH = 32


# Between JSON tokens in a constrained output: nothing, one space, or a newline and an
# indentation. A model may not pad with endless whitespace (llguidance's flexible default
# allows any run, and small models do loop on newlines there); it still reads as pretty JSON.
JSON_WHITESPACE = r"(\x20|\n[\x20\t]{0,20})?"


@dataclass(frozen=True)
class OutputFormat:
    """What the output must be: ``json_object`` any JSON object, ``json_schema`` one that follows
    ``schema`` (its JSON text), ``lark`` text that a Lark grammar (``schema``, in llguidance's
    dialect) takes. Decoding is held to it token by token (engine.decode.grammar)."""

    kind: Literal["json_object", "json_schema", "lark"] = "json_object"
    schema: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("json_object", "json_schema", "lark"):
            raise InvalidRequest(f"the output format must be 'json_object', 'json_schema' or 'lark', not {self.kind!r}")
        if self.kind != "json_object" and not self.schema:
            raise InvalidRequest(f"a {self.kind} output format needs its schema")


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
    output_format: OutputFormat | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("greedy", "sample"):
            raise InvalidRequest(f"mode must be 'greedy' or 'sample', not {self.mode!r}")
        if _finite("temperature", self.temperature) < 0:
            raise InvalidRequest(f"temperature must be >= 0, not {self.temperature}")
        if self.mode == "sample" and self.temperature <= 0:
            raise InvalidRequest("temperature must be > 0 when sampling (use greedy for 0)")
        if not 0 < _finite("top_p", self.top_p) <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], not {self.top_p}")
        if _whole("top_k", self.top_k) < 0:
            raise InvalidRequest(f"top_k must be >= 0 (0: no limit), not {self.top_k}")
        if _whole("max_new_tokens", self.max_new_tokens) < 1:
            raise InvalidRequest(f"max_new_tokens must be at least 1, not {self.max_new_tokens}")
        if not 0 <= _whole("seed", self.seed) <= MAX_SEED:
            raise InvalidRequest(f"seed must be between 0 and 2**64 - 1, not {self.seed}")
        for stop in self.stop_strings:
            if not isinstance(stop, str) or not stop:
                raise InvalidRequest(f"a stop string must be non-empty text, not {stop!r}")
            _check_utf8(stop, f"the stop string {stop!r}")
        if self.draft_length is not None and not 0 <= _whole("draft_length", self.draft_length) <= MAX_DRAFT_LENGTH:
            raise InvalidRequest(f"draft_length must be between 0 and {MAX_DRAFT_LENGTH}")
        if not 1 <= _whole("max_draft_length", self.max_draft_length) <= MAX_DRAFT_LENGTH:
            raise InvalidRequest(f"max_draft_length must be between 1 and {MAX_DRAFT_LENGTH}")


@dataclass(frozen=True)
class DrafterOptions:
    """How a draft model is loaded. None of it affects what the target accepts, only the cost of a
    draft step and how often drafts agree with the target.

    head "pruned" scores only ``vocab_size`` frequent tokens (engine.drafters.draft_vocab) plus the
    request's own tokens; "full" scores the whole vocabulary. precision "auto" is int8 weights
    where a fast int8 kernel runs (CPU; int4 next to an int8 / int4 / GGUF target, see
    engine.models.loading.loader.drafter_weights), else the target's dtype; "int8", "int4", "bf16", "fp32" force one.
    A GGUF drafter at int8 / int4 gets its decoder layers re-quantized (engine.models.loading.gguf_drafter);
    at bf16 / fp32 it runs its file's own blocks.
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
            raise InvalidRequest(f"drafter head must be 'pruned' or 'full', not {self.head!r}")
        if self.precision not in ("auto", "int8", "int4", "bf16", "fp32"):
            raise InvalidRequest(f"drafter precision must be auto, int8, int4, bf16 or fp32, not {self.precision!r}")
        if _whole("vocab_size", self.vocab_size) < 1:
            raise InvalidRequest(f"vocab_size must be >= 1, not {self.vocab_size}")
        if not 0 <= _finite("min_confidence", self.min_confidence) < 1:
            raise InvalidRequest(f"min_confidence must be in [0, 1), not {self.min_confidence}")
