"""Prometheus text from a remote engine, and the speculative-decoding counters in it.

vLLM exports ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position}``
(``tandem serve`` uses the same names); llama.cpp's server (``--metrics``) exports
``llamacpp:prompt_tokens_total``, ``llamacpp:tokens_predicted_total`` and friends but no draft
counters (it reports drafting per request, in ``timings``). Counters only grow, so what one
request did is the difference of two scrapes around it, exact when nothing else ran meanwhile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"
LLAMACPP_PREDICTED = "llamacpp:tokens_predicted_total"
LLAMACPP_PROMPT = "llamacpp:prompt_tokens_total"
# Draft positions counted per position: drafts are a few to ~20 tokens long. A larger (or
# non-integer) position label is ignored, not a tuple that long.
MAX_POSITIONS = 256


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def parse_samples(text: str) -> tuple[Sample, ...]:
    """Every sample of an exposition (counters keep their ``_total`` name)."""
    samples = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    return tuple(samples)


def total(samples: tuple[Sample, ...], name: str) -> float | None:
    """The sum over every label set (several engines, models or ranks), None when absent."""
    values = [s.value for s in samples if s.name == name]
    return sum(values) if values else None


@dataclass(frozen=True)
class SpecCounters:
    """The spec-decode counters of one scrape; None fields were not exported."""

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    accepted_per_position: tuple[float, ...] = ()
    generation_tokens: float | None = None
    flavour: str = "none"  # "vllm" (spec-decode counters), "llama.cpp" (token counters only), "none"

    @property
    def reports_drafts(self) -> bool:
        return self.draft_tokens is not None and self.accepted is not None


def spec_counters(text: str) -> SpecCounters:
    samples = parse_samples(text)
    per_pos: dict[int, float] = {}
    for s in samples:
        if s.name == VLLM_ACCEPTED_PER_POS:
            label = dict(s.labels).get("position", "0")
            position = int(label) if label.isascii() and label.isdigit() and len(label) <= 4 else MAX_POSITIONS
            if position < MAX_POSITIONS:
                per_pos[position] = per_pos.get(position, 0.0) + s.value
    draft_tokens = total(samples, VLLM_DRAFT_TOKENS)
    if draft_tokens is not None:
        flavour = "vllm"
        generated = total(samples, VLLM_GENERATION_TOKENS)
    elif total(samples, LLAMACPP_PREDICTED) is not None:
        flavour, generated = "llama.cpp", total(samples, LLAMACPP_PREDICTED)
    else:
        flavour, generated = "none", total(samples, VLLM_GENERATION_TOKENS)
    return SpecCounters(
        drafts=total(samples, VLLM_DRAFTS), draft_tokens=draft_tokens, accepted=total(samples, VLLM_ACCEPTED),
        accepted_per_position=tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else (),
        generation_tokens=generated, flavour=flavour,
    )


@dataclass(frozen=True)
class SpecDelta:
    """What the counters grew by around one request."""

    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_position: tuple[int, ...]
    generation_tokens: int | None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per target pass, its own included (vLLM's mean acceptance length)."""
        return 1 + self.accepted / self.drafts if self.drafts else None


def spec_delta(before: SpecCounters, after: SpecCounters) -> SpecDelta | None:
    """None when the server exports no draft counters (llama.cpp, a server without speculation
    that omits them), or when they went down (the server restarted between the scrapes)."""
    if not (before.reports_drafts and after.reports_drafts):
        return None
    finite = lambda c: all(math.isfinite(v) for v in (c.drafts or 0.0, c.draft_tokens, c.accepted,
                                                      *c.accepted_per_position))
    if not (finite(before) and finite(after)):  # +Inf / NaN counters: nothing to subtract
        return None
    grown = lambda a, b: int(round((a or 0.0) - (b or 0.0)))
    delta_tokens, delta_accepted = grown(after.draft_tokens, before.draft_tokens), grown(after.accepted, before.accepted)
    if delta_tokens < 0 or delta_accepted < 0:
        return None
    n = max(len(before.accepted_per_position), len(after.accepted_per_position))
    pad = lambda t: tuple(t) + (0.0,) * (n - len(t))
    per_pos = tuple(grown(a, b) for a, b in zip(pad(after.accepted_per_position), pad(before.accepted_per_position)))
    generated = (grown(after.generation_tokens, before.generation_tokens)
                 if after.generation_tokens is not None and before.generation_tokens is not None
                 and math.isfinite(after.generation_tokens - before.generation_tokens) else None)
    return SpecDelta(grown(after.drafts, before.drafts), delta_tokens, delta_accepted, per_pos, generated)
