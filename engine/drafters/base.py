"""The drafter interface (the shape of transformers' CandidateGenerator)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from engine.core.sampler import Sampler
from engine.models.runners.interface import Runner

if TYPE_CHECKING:  # the decoding loop (above the drafters) owns the grammar
    from engine.decode.grammar import GrammarConstraint


@dataclass(frozen=True)
class Draft:
    """tokens: up to k proposed ids. probs: [len(tokens), V] distribution each token was drawn
    from (q) when sampling with a stochastic drafter; None for greedy or deterministic drafts."""

    tokens: tuple[int, ...]
    probs: torch.Tensor | None = None


class DrafterMismatch(ValueError):
    """A drafter that cannot draft for this target (another tokenizer, another architecture);
    the message names what differs, for the user."""


class Drafter(Protocol):
    name: str
    #: True when proposing costs about nothing (no model forward), so k is not cost-limited.
    free: bool
    #: Seconds of the last ``propose`` spent reading tokens decoded while speculation was off: a
    #: one-off cost of switching on, which the draft-length controller keeps out of its price
    #: of a drafted token.
    catch_up_s: float
    #: Seconds of the last ``propose`` spent on the drafter's prefill of the prompt where it
    #: reads the prompt only when it first drafts: paid once a request, not per off token.
    prefill_s: float
    #: The most tokens a catch-up reads (of a longer stretch decoded while speculation was off,
    #: only the last ones): a probe's catch-up stops growing with the wait there. None: all.
    catch_up_limit: int | None
    #: Drafters that read the target's own hidden states and K/V (Gemma 4 assistants, MTP
    #: layers) take the request's target runner here before its prefill; None for the others.
    attach_target: Callable[[Runner], None] | None
    #: Drafters that draft under the output's grammar (a draft model) take the request's
    #: constraint here (None: free text); None where the loop only filters the drafts.
    follow: Callable[[GrammarConstraint | None], None] | None
    #: Drafters that read the target's states and keep their own cache of them across requests
    #: (EAGLE-3, DFlash): ``keep_prefix(n)``, given the n first positions the target's cache keeps
    #: for the next request, crops the drafter's cache to what stays valid and returns how many
    #: positions it kept (at most n): the target hands over its states from there again. None
    #: for the others (reset at every request).
    keep_prefix: Callable[[int], int] | None

    def reset(self) -> None:
        """Forget everything about the previous request."""

    def prepare(self, prompt: list[int]) -> None:
        """Read the prompt ahead of the first proposal (the drafter's prefill), so that
        per-step draft costs measure drafting alone."""

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        """Propose up to k tokens to follow ``context`` (prompt + generated so far)."""

    def observe(self, valid_length: int) -> None:
        """After verification, the first ``valid_length`` tokens of context + draft are final;
        anything the drafter cached beyond that must be dropped."""


class DrafterBase:
    """The optional members' defaults: a drafter that never falls behind, reads only tokens and
    leaves the grammar to the loop. Drafters override what they do."""

    catch_up_s = 0.0
    prefill_s = 0.0
    catch_up_limit: int | None = None
    attach_target: Callable[[Runner], None] | None = None
    follow: Callable[[GrammarConstraint | None], None] | None = None
    keep_prefix: Callable[[int], int] | None = None
