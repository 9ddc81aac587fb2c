"""A drafter (a draft model, or one made for the target) that lets prompt lookup draft for free
where the text copies itself.

Rewriting, editing and summarizing repeat long stretches of the prompt; there a lookup guess
(what followed the latest earlier occurrence of the context's trailing n-gram) is accepted about
as often as the draft model's tokens and costs no drafter pass at all. Elsewhere (fresh code,
prose) short n-gram matches are mostly wrong, and a wasted pass costs more than the drafter
steps it saves. So each step picks one source from what this request has shown so far:

- every lookup guess, used or not, is scored afterwards against the tokens actually produced
  (the next context says what they were), so lookup's track record builds while the model drafts;
- the model's own drafts are scored the same way;
- lookup drafts when its expected tokens per target pass beat the model's once the model's
  drafter steps are paid for.

The draft model reads the prompt only when it first drafts: where lookup drafts a whole request
(an edit that copies the pasted file), the model's prefill of that file is never paid. A drafter
made for the target (EAGLE-3, DFlash) keeps the target's states of every pass, lookup's too (they
cost a copy), and reads them when it next drafts; its cache stays with it across requests.

Which source proposed a token does not matter for losslessness: lookup drafts are
deterministic (q is one-hot, which the verifier handles) and every token is verified.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from engine.core.sampler import Sampler
from engine.drafters.base import Draft, DrafterBase
from engine.drafters.prompt_lookup import longest_match_continuation
from engine.models.runners.prefix_reuse import common_prefix

#: While speculation is off, a lookup guess is verified where its expected tokens per pass beat
#: a plain pass by this factor (what the wider pass costs, measured, is already counted).
OFF_MARGIN = 1.1


class LookupFirstDrafter(DrafterBase):
    """``model``: the draft model (DraftModelDrafter) or a drafter made for the target (EAGLE-3,
    DFlash). ``min_match``: the shortest trailing n-gram whose continuation is worth a guess
    (shorter matches are mostly chance). ``model_cost``: a target pass that verifies model
    drafts costs this many lookup passes (its drafter steps: on the default pair k ~ 4 steps at
    c ~ 0.12 of a target pass next to a ~1.7-pass verification).
    ``decay``: how fast the track records forget (0.6: two failed guesses in a row hand drafting
    back to the model). ``prior`` / ``lookup_prior``: tokens credited to the model and to lookup
    at the start of a request. Lookup starts low: its guesses are scored while the model drafts,
    so one right guess is enough to earn it a turn, and in fresh code an untested guess from a
    3-token match mostly fails (measured on the bench prompts: 1.5 tokens right on average,
    against 2-3 for the draft model)."""

    free = False

    def __init__(self, model, min_match: int = 3, model_cost: float = 1.3, decay: float = 0.6, prior: float = 1.5,
                 lookup_prior: float = 0.5) -> None:
        self.model = model
        self.name = f"{model.name} + prompt lookup"
        self.min_match = min_match
        self.model_cost = model_cost
        self.decay = decay
        self.prior = prior
        self.lookup_prior = lookup_prior
        self._model_prepared = True  # until a prepare(): the model catches up in propose
        # A drafter that reads the target's states takes the target and keeps its cache across
        # requests as it does alone; one that drafts under no grammar of its own has no follow.
        self._reads_target = model.keep_prefix is not None
        if self._reads_target:
            self.attach_target = model.attach_target
            self.keep_prefix = self._keep_prefix
        if model.follow is None:
            self.follow = None
        self.reset()

    @property
    def catch_up_limit(self) -> int | None:
        return getattr(self.model, "catch_up_limit", None)

    @property
    def target(self):
        """The runner a drafter made for the target reads (the decoding loop checks it is the request's)."""
        return getattr(self.model, "target", None)

    # -- the Drafter interface ------------------------------------------------------------
    def reset(self) -> None:
        self.model.reset()
        self._new_request()

    def _keep_prefix(self, n: int) -> int:
        self._new_request()  # the scores are this request's; the model's cache is kept
        return self.model.keep_prefix(n)

    def _new_request(self) -> None:
        self._held_guess: list[int] | None = None  # guess_while_off's whole guess, for the next propose
        self.catch_up_s = 0.0  # the model drafter's, for the pass it drafted (see DraftModelDrafter)
        self.prefill_s = 0.0  # the model's deferred prefill of the prompt, on the pass that paid it
        self.lookup_score = self.lookup_prior  # decayed mean of tokens a lookup guess got right
        self.model_score = self.prior  # decayed mean of model draft tokens accepted
        self.lookup_steps = 0  # drafts proposed by lookup in this request
        self.model_steps = 0
        self._pending: tuple[int, list[int], tuple[int, ...], bool] | None = None

    def follow(self, grammar) -> None:
        """The draft model drafts under the output's grammar (lookup guesses are verified as they are)."""
        self.model.follow(grammar)

    def prepare(self, prompt: list[int]) -> None:
        if self._reads_target:  # keeps the prompt's states now; reads them when it first drafts
            self.model.prepare(prompt)
            return
        # Deferred to the model's first draft of this request (lookup may draft all of it).
        self._model_prepared = False

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        self._score_previous(context)
        held, self._held_guess = self._held_guess, None
        self.catch_up_s = self.prefill_s = 0.0
        if k <= 0:
            return Draft(())
        if held:
            # Verify k of the guess but score all of it: a guess verified whole can then be
            # credited the target's next token too, so its record can grow past its length.
            self.lookup_steps += 1
            self._pending = (len(context), held, tuple(held[:k]), True)
            return Draft(tuple(held[:k]))
        _, guess = longest_match_continuation(context, k, min_ngram=self.min_match)
        if guess and self._lookup_pays():
            self.lookup_steps += 1
            self._pending = (len(context), guess, tuple(guess), True)
            return Draft(tuple(guess))
        prepare_s = 0.0
        if not self._model_prepared:
            start = time.perf_counter()
            self.model.prepare(context)
            self._model_prepared = True
            prepare_s = time.perf_counter() - start  # a one-off, as a catch-up is
        draft = self.model.propose(context, k, sampler)
        self.catch_up_s, self.prefill_s = self.model.catch_up_s, prepare_s
        self.model_steps += 1
        self._pending = (len(context), guess, draft.tokens, False)
        return draft

    def guess_while_off(self, context: list[int], k: int, cost: Callable[[int], float]) -> int:
        """While the draft-length controller has speculation switched off (the model's drafts did
        not pay): how many of lookup's guessed tokens the next pass verifies, 0 for a plain pass.
        A guess costs no drafter step, only the wider verification (``cost(j)``: a pass that
        verifies j drafts, in plain passes), so it is drafted where lookup's record of tokens
        right per guess pays for that by OFF_MARGIN; the next ``propose`` returns it. A guess not
        drafted is scored all the same, so the record follows the text while speculation is off."""
        self._score_previous(context)
        _, guess = longest_match_continuation(context, k, min_ngram=self.min_match)
        if not guess:
            return 0
        gain, best = max(((min(self.lookup_score, j) + 1) / cost(j), j) for j in range(1, len(guess) + 1))
        if gain > OFF_MARGIN:
            self._held_guess = guess
            return best
        self._pending = (len(context), guess, (), False)
        return 0

    def observe(self, valid_length: int) -> None:
        if self._model_prepared:  # else its next prepare() reads the context anyway
            self.model.observe(valid_length)

    # -- choosing a source ------------------------------------------------------------------
    def _lookup_pays(self) -> bool:
        # Tokens per pass: accepted drafts + the target's own token.
        return (self.lookup_score + 1) * self.model_cost >= self.model_score + 1

    def _score_previous(self, context: list[int]) -> None:
        """Score the previous step's guess and draft against what the target produced."""
        if self._pending is None:
            return
        start, guess, drafted, from_lookup = self._pending
        self._pending = None
        produced = context[start:]
        if len(context) < start or not produced:
            return  # a different request (reset was skipped); nothing to learn
        d = self.decay
        if guess:
            self.lookup_score = d * self.lookup_score + (1 - d) * common_prefix(guess, produced)
        if drafted and not from_lookup:
            # produced = accepted drafts + the target's token, so the common prefix is exact.
            self.model_score = d * self.model_score + (1 - d) * common_prefix(drafted, produced)
