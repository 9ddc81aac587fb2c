"""Events the engine yields while generating. Frozen, typed, safe to pass across threads."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Loaded:
    name: str
    device: str
    dtype: str
    seconds: float


@dataclass(frozen=True)
class Tokens:
    """One decoding step's output. ``from_draft[i]`` says whether token i was proposed by the
    drafter and accepted (True) or produced by the target itself (False). ``drafted`` and
    ``accepted`` count the step's draft block, including tokens cut off by a stop condition."""

    text: str
    token_ids: tuple[int, ...]
    from_draft: tuple[bool, ...]
    drafted: int
    accepted: int
    step_ms: float


@dataclass(frozen=True)
class RunStats:
    """Figures for a run so far. ``tok_per_s`` counts new tokens over wall time from the start of
    the request (prefill included), ``ttft_s`` is time to the first new token.
    ``decode_tok_per_s`` counts the tokens after the first over the time after it: the generation
    rate without the prompt's prefill (what llama.cpp reports as its eval / tg rate), 0 until a
    second token exists.
    ``mean_accepted_per_pass`` is accepted draft tokens per target verification pass;
    ``tokens_per_pass`` adds the target's own token (the usual "acceptance length").
    ``prompt_done`` of ``prompt_tokens`` are in the target's cache (the prefill's progress);
    ``cached_tokens`` of them were kept from an earlier request, not prefilled again.
    ``forced_tokens``: of the new tokens, those an output format allowed alone (a JSON key's
    closing quote, say), committed without a pass (engine.decode.grammar).
    ``threads_fewest`` / ``threads_max``: see the fields."""

    new_tokens: int = 0
    seconds: float = 0.0
    tok_per_s: float = 0.0
    ttft_s: float | None = None
    decode_tok_per_s: float = 0.0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance: float = 0.0
    mean_accepted_per_pass: float = 0.0
    tokens_per_pass: float = 0.0
    acceptance_by_position: tuple[float, ...] = ()
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    speculation_off_steps: int = 0
    prompt_tokens: int = 0
    prompt_done: int = 0
    cached_tokens: int = 0
    forced_tokens: int = 0
    #: The fewest CPU threads a step of this request ran with, of at most ``threads_max``: fewer
    #: when other programs kept cores busy (engine.core.threads); 0 where nobody counted.
    threads_fewest: int = 0
    threads_max: int = 0


@dataclass(frozen=True)
class Stats:
    stats: RunStats


@dataclass(frozen=True)
class Finished:
    """reason: 'eos', 'stop_string', 'max_new_tokens' or 'cancelled'."""

    reason: str
    stats: RunStats
    token_ids: tuple[int, ...] = field(default=())
    text: str = ""


class PlainVsSpeculative:
    """What a plain and a speculative run of one prompt say together; a base for the frozen
    result dataclasses that hold both (``plain`` and ``speculative``)."""

    plain: Finished
    speculative: Finished

    @property
    def identical(self) -> bool:
        return self.plain.token_ids == self.speculative.token_ids

    @property
    def speedup(self) -> float:
        p = self.plain.stats.tok_per_s
        return self.speculative.stats.tok_per_s / p if p else 0.0


@dataclass(frozen=True)
class Failed:
    error: str


Event = Loaded | Tokens | Stats | Finished | Failed
