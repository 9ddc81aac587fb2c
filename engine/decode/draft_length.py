"""Choosing the draft length k per step from measured costs and observed acceptance.

Model (Leviathan et al., sec. 3.4): with per-token acceptance rate a, a pass that drafts k tokens
yields E[tokens] = (1 - a^(k+1)) / (1 - a). It costs k drafter steps (c seconds each) plus one
target pass over k+1 tokens, v(k) = v0 + v1*k: v0 is measured by making the first step after
prefill a plain one-token pass, v1 from every speculative pass since. The speedup over
plain decoding (one token per v(0)) is S(k) = E[tokens] * v(0) / (v(k) + k*c). We pick the k that
maximises S and draft nothing (k = 0) when no k is expected to beat plain decoding; after a while
we probe again with k = 1 so a request whose text becomes predictable regains speculation.

Switching off must cost plain decoding next to nothing (prose that a drafter predicts badly
must not run slower than plain), so: speculation resumes only when expected to beat plain by a
margin (``resume_margin``: no on/off flapping around S = 1 where the estimate is noise), and each
failed probe doubles the wait before the next one: rejected, or accepted without bringing
speculation back. A probe costs more than its draft step: the drafter first catches up on every token
since the last one, and the verification is wider. Measured on an int4 target (a wider
verification costs ~35% more per row there): accepted probes every 16 tokens that never paid
ran the request at 0.88x of plain. That catch-up costs a fixed share of a plain step per off
token whatever the wait, so where even 95% acceptance would gain less than twice that share,
probing waits the longest and a request seeded with such costs lets the drafter skip the prompt
until it drafts (int4 there: 0.87x -> 1.0x).

v(0) is measured on plain passes only, and while speculation runs there are none: a v(0) taken
once, on a slow first step (a machine whose memory is busier for a moment), made every later
verification look free (v1 = verify - v(0) clamped at 0), and prose at 0.5 acceptance kept
speculating at 0.89x of plain. So where the decision is close (the best k expected to gain less
than ``REFRESH_BELOW``), every ``REFRESH_EVERY`` speculative passes one pass is a plain one that
measures v(0) again; where speculation clearly pays, a stale v(0) cannot flip the decision and no
pass is given up.

Costs seeded from an earlier request are that request's machine: one that ran while other
programs took the cores measured dear drafting, and the quiet requests after it started off and
never drafted, so never measured again and handed the same figures on (measured: every pass of
every later request of a run off, 0.95x of plain). Two rules end that. Until this request drafts,
the seeded v1, draft and catch-up costs follow the ratio of its plain passes' v(0) to the seed's
(a machine twice as fast makes every step cheaper alike); and where that ratio shows the machine
changed (v(0) off the seed's by more than ``MACHINE_CHANGED``: other programs came or went) a
request that started off probes after ``probe_every`` tokens, whatever the old figures said of
probing: contention slows small draft steps more than the target's, so the old ratios are
suspect too. On a machine that did not change, a seed ``STALE_AFTER`` requests old (the
requests since drafting was last measured) buys one such probe.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class MeasuredCosts:
    """What a finished request measured, to seed the next one on the same models: seconds of a
    one-token target pass (v0), per extra verified token (v1) and per draft step, and the
    acceptance rate it saw."""

    v0: float
    v1: float
    draft_step_s: float
    acceptance: float = 0.7
    #: Seconds per token the drafter took to catch up on tokens decoded while speculation was
    #: off (0 when unmeasured): what every probe pays per off step before it drafts.
    catch_up_per_token_s: float = 0.0
    #: Requests since drafting was last measured (0: the request that handed these on drafted).
    age: int = 0
    #: Tokens of context where v1 was measured (0: not known). A verified row attends over the
    #: whole cache, so v1 at 4,096 tokens is several times v1 at 1,000.
    context: int = 0


DRAFT_COST_WINDOW = 8  # passes whose per-token draft cost the estimate is the median of
PROBE_BUDGET = 0.05  # share of the off steps' time that probing may cost
#: Probing is worth it only while the best speculation could do (at 95% acceptance) gains at
#: least this many times what catching the drafter up costs per off token.
PROBE_GAIN_OVER_CATCH_UP = 2.0
REFRESH_EVERY = 12  # speculative passes between two plain passes that measure v(0) again
REFRESH_BELOW = 1.3  # ... while the best expected speedup is below this
REFRESH_WEIGHT = 0.5  # how much a refresh pass's time moves v(0)
STALE_AFTER = 4  # requests without drafting after which seeded costs are measured again
MACHINE_CHANGED = 1.5  # a v(0) this many times the seed's, or its inverse: measure drafting again
#: From this many tokens of context, a request whose verification cost is not measured at about
#: its context drafts one token at first: a 5-row verification costs 2.3-2.6 plain steps at
#: 4,096 tokens on 2 cores (the first pass of a 4k-token request seeded from a 1k one cost
#: 300 ms for one token), one extra row ~0.3.
LONG_CONTEXT = 1024
#: A seed measured at a context this many times shorter or longer than the request's says little
#: of its verification cost: the request measures v1 afresh.
CONTEXT_CHANGED = 1.5


class DraftLengthController:
    def __init__(
        self,
        fixed: int | None = None,
        max_k: int = 8,
        initial_k: int = 4,
        prior_acceptance: float = 0.7,
        decay: float = 0.9,
        probe_every: int = 16,
        max_probe_every: int = 128,
        resume_margin: float = 1.05,
        drafting_is_free: bool = False,
        known: MeasuredCosts | None = None,
        context_tokens: int = 0,
        catch_up_limit: int | None = None,
    ) -> None:
        """``known``: costs an earlier request measured on the same models. The first step is
        then no calibration pass, and speculation starts off when those costs and that
        request's acceptance leave no draft length paying by ``resume_margin`` (a quantized
        target whose wide verification is dear): the request does not pay for a first draft
        and its catch-ups to find out again. Probes follow as usual. ``context_tokens``: the
        request's prompt length; from LONG_CONTEXT on, where no seed measured verification at
        about that context, the first draft is one token (it measures v1 here cheaply). A seed
        from such another context seeds no v(0) either: a plain step's cost grows with the
        context, and v1 is measured against v(0) (a 23-token request's v(0) under a 672-token
        request's first verification made one extra row look like 0.45 of a step, and switched
        speculation off for the reply): the first pass is then a plain one again.
        ``catch_up_limit``: the most off tokens the drafter reads when it next drafts (the
        drafter's own; None: all of them), past which a probe's catch-up stops growing."""
        self.fixed = fixed
        self.max_k = max_k
        self._context = context_tokens
        self._catch_up_limit = catch_up_limit
        # Whether the seed's v1 belongs to a much shorter or longer context: then it is not used.
        stale = (known is not None and known.context > 0 and context_tokens > 0
                 and abs(math.log(context_tokens / known.context)) > math.log(CONTEXT_CHANGED))
        unmeasured_here = known is None or known.context == 0 or stale
        self.initial_k = min(initial_k, max_k) if context_tokens < LONG_CONTEXT or not unmeasured_here else 1
        self.k = 0  # the first step is a plain pass that measures v(0)
        self.decay = decay
        self.probe_every = probe_every
        self.max_probe_every = max_probe_every
        self.resume_margin = resume_margin
        self._wait = probe_every  # off steps before the next probe
        self.drafting_is_free = drafting_is_free
        # Acceptance as decayed counts of (accepted, tried) draft positions, seeded by a prior.
        self._acc = prior_acceptance * 4
        self._tries = 4.0
        # Per-token draft costs of the last passes. A median, not a decayed average: a request's
        # first pass pays one-offs (measured: 18.7 ms a token against ~10 after), and seeded with
        # it an average kept drafting looking dear for a dozen passes, long enough to switch
        # speculation off for the whole request and, through ``known``, the next ones.
        self._draft_costs: deque[float] = deque(maxlen=DRAFT_COST_WINDOW)
        self._v0: float | None = None  # seconds for a one-token target pass
        self._v1: float | None = None  # extra seconds per verified draft token
        self._off_steps = 0
        self._probe_cost = 0.0  # seconds the last probe cost over a plain step
        self._probe_catch_up = 0.0  # ... of which its drafter's catch-up (which grows with the wait)
        self._probing = False  # speculation is off and only probes run
        self._calibrated = False
        self._catch_up_per_token: float | None = None
        self._off_since_draft = 0  # off steps since the drafter last drafted (it catches up on them)
        self._since_plain = 0  # speculative passes since the last plain one
        self._resume_k = 0  # > 0 while the next pass is a plain one that refreshes v(0): k after it
        #: True when this request starts with speculation off and probing does not pay for
        #: itself: the drafter need not read the prompt until (if ever) it drafts.
        self.drafter_can_wait = False
        self._seed_age = 0  # the age of the seeded costs (MeasuredCosts.age)
        self._seed_context = 0  # where the seed measured v1 (MeasuredCosts.context)
        self._seed_v0: float | None = None  # the seed's v(0): this request's against it shows a changed machine
        self._drafted = False  # whether this request measured drafting (then its costs are fresh)
        self._off_this_pass = False  # see plan / pass_was_off
        self._v0_of_other_context = False  # the seeded v(0) was measured at another context
        if known is not None and fixed is None:
            self._seed_age, self._seed_v0, self._seed_context = known.age, known.v0, known.context
            # A v1 of another context is none: until this request measures its own, verify_cost's
            # default (10% of a step a row) stands in, and the first draft is short (above).
            self._v0, self._v1 = known.v0, None if stale else known.v1
            self._draft_costs.append(known.draft_step_s)
            self._catch_up_per_token = known.catch_up_per_token_s or None
            # A v(0) of another context: measured again by a plain first pass (whose figure
            # replaces it, see record), unless the request starts off anyway.
            self._calibrated = not stale
            self._v0_of_other_context = stale
            # Costs belong to the models and the machine; acceptance belongs to a request's text
            # (code after prose). Start from the better of the prior and the last request's: seeded
            # low, a request that speculation would suit started off, probed too rarely to find
            # out in a short answer, and handed the same low figure to the next request, so one
            # prose answer switched speculation off for every later request of a bench run.
            self._acc = max(prior_acceptance, known.acceptance) * self._tries
            paying = max(self.expected_speedup(k) for k in range(1, self.max_k + 1))
            if paying < self.resume_margin:
                self._calibrated = True  # its first pass is an off one, which measures v(0) as well
                self._probing = True  # off from the start; probes as usual
                if not self.probing_pays():
                    self.drafter_can_wait = True
                    if known.age < STALE_AFTER:
                        self._wait = self.max_probe_every
            elif not stale:
                self.k = self.initial_k

    @property
    def _draft_step_s(self) -> float | None:
        """Seconds per draft token: the lower median of the last passes' (None before any)."""
        if not self._draft_costs:
            return None
        return sorted(self._draft_costs)[(len(self._draft_costs) - 1) // 2]

    @property
    def acceptance(self) -> float:
        return self._acc / self._tries

    @property
    def switched_off(self) -> bool:
        """Whether the next pass is plain because speculation does not pay now: not the pass that
        calibrates v(0) before the first draft, nor one that refreshes it, nor a fixed length."""
        return self.fixed is None and self.k == 0 and self._calibrated and self._resume_k == 0

    def next_k(self) -> int:
        if self.fixed is not None:
            return self.fixed
        return self.k

    def plan(self, budget: int) -> int:
        """The drafts to request for the next pass: this controller's k, never past a token
        ``budget`` (the target adds one token of its own). Only the controller's own choice of
        0 counts as speculation switched off (``pass_was_off``): not its calibration or v(0)
        refresh passes, nor a last pass with no budget left to draft."""
        self._off_this_pass = self.switched_off
        return max(0, min(self.next_k(), budget - 1))

    @property
    def pass_was_off(self) -> bool:
        """Whether the pass ``plan`` last planned ran with speculation switched off."""
        return self._off_this_pass

    def settle(self, drafted: int, n_accepted: int, verify_s: float, draft_s: float, requested: int,
               catch_up_s: float = 0.0, prefill_s: float = 0.0) -> None:
        """Record a planned pass. ``draft_s`` includes the drafter's ``catch_up_s`` (reading the
        tokens decoded while speculation was off) and ``prefill_s``, a prompt prefill deferred to
        the first draft: neither is the price of a drafted token. A catch-up is paid per off
        token at every probe; a prefill once a request, so it is no catch-up rate (counted as
        one over the single plain pass before the first draft, a 64-token window's prefill made
        every probe look as dear as six plain steps)."""
        drafting = max(0.0, draft_s - prefill_s)
        catch_up = min(drafting, catch_up_s)
        self.record(drafted, n_accepted, verify_s, drafting - catch_up, requested=requested, catch_up_s=catch_up,
                    one_off_s=min(draft_s, prefill_s))

    def record(
        self, k: int, n_accepted: int, verify_s: float, draft_s: float, requested: int | None = None,
        catch_up_s: float = 0.0, one_off_s: float = 0.0,
    ) -> None:
        """Update from one step: k drafted (of ``requested``), n accepted, and the timings of
        its two halves. A drafter may propose fewer than requested (prompt lookup with no
        match); only a requested k of 0 means speculation was switched off. ``catch_up_s``: the
        drafter reading the tokens decoded since it last drafted; ``one_off_s``: a cost this
        request pays once (the drafter's deferred prefill)."""
        d = self.decay
        if self._probing and k > 0:
            # What this probe cost over a plain step: its drafting, the drafter's catch-up on the
            # tokens decoded while off, and the wider verification.
            self._probe_cost = draft_s + catch_up_s + one_off_s + max(0.0, verify_s - (self._v0 or verify_s))
            self._probe_catch_up = catch_up_s
        if k > 0 and catch_up_s > 0 and self._off_since_draft > 0:
            read = self._off_since_draft if self._catch_up_limit is None else min(self._off_since_draft, self._catch_up_limit)
            self._catch_up_per_token = catch_up_s / read
        self._off_since_draft = 0 if k > 0 else self._off_since_draft + 1
        if k > 0:
            self._drafted = True
            tried = n_accepted + (1 if n_accepted < k else 0)
            self._acc = d * self._acc + n_accepted
            self._tries = d * self._tries + tried
            self._draft_costs.append(draft_s / k)
        self._since_plain = 0 if k == 0 else self._since_plain + 1
        if k == 0 and self._resume_k and requested == 0:
            # The refresh pass: v(0) as the machine runs now, then the decision it informs.
            self._v0 = verify_s if self._v0 is None else (1 - REFRESH_WEIGHT) * self._v0 + REFRESH_WEIGHT * verify_s
            resume, self._resume_k = self._resume_k, 0
            self.k = self._choose(previous=resume)
            return
        if k == 0 and self._v0_of_other_context:
            # Replaced, not averaged, and no machine change read from it: the seed's v(0) differs
            # by the context as much as by the machine.
            self._v0, self._v0_of_other_context, self._seed_v0 = verify_s, False, None
        elif k == 0:
            before = self._v0
            self._v0 = verify_s if self._v0 is None else d * self._v0 + (1 - d) * verify_s
            if before and not self._drafted:
                self._rescale(self._v0 / before)
                if self._seed_v0 and self._probing and abs(math.log(self._v0 / self._seed_v0)) > math.log(MACHINE_CHANGED):
                    self._wait = min(self._wait, self.probe_every)  # measure drafting on this machine
                    self._seed_v0 = None  # once
        elif self._v0 is not None:
            slope = max(0.0, (verify_s - self._v0) / k)
            self._v1 = slope if self._v1 is None else d * self._v1 + (1 - d) * slope
        self.k = self._choose(previous=k if requested is None else requested, n_accepted=n_accepted)

    def _rescale(self, ratio: float) -> None:
        """Costs not measured in this request (seeded) follow its v(0): scale them by ``ratio``."""
        if self._v1 is not None:
            self._v1 *= ratio
        self._draft_costs = deque((c * ratio for c in self._draft_costs), maxlen=DRAFT_COST_WINDOW)
        if self._catch_up_per_token:
            self._catch_up_per_token *= ratio

    def measured(self) -> MeasuredCosts | None:
        """The costs measured so far, once all three are (for ``known`` of a later request)."""
        if self._v0 is None or self._v1 is None or self._draft_step_s is None:
            return None
        return MeasuredCosts(self._v0, self._v1, self._draft_step_s, self.acceptance, self._catch_up_per_token or 0.0,
                             age=0 if self._drafted else self._seed_age + 1,
                             context=self._context if self._drafted else self._seed_context)

    def _affordable_wait(self) -> int:
        """The fewest off steps between probes for probing to cost PROBE_BUDGET of their time: a
        probe costs a fixed part (its draft, the wider verification) and the drafter's catch-up,
        which grows with the wait by the catch-up per token up to the drafter's catch-up limit,
        and no further. Where the catch-up per token alone reaches the budget (a drafter that
        reads 8% of a plain step's time per token, on 2 cores), only a wait past that limit is
        long enough; with no limit, none is: the longest."""
        budget = PROBE_BUDGET * self._v0
        per_token = self._catch_up_per_token or 0.0
        fixed = max(0.0, self._probe_cost - self._probe_catch_up)
        limit = self._catch_up_limit
        if per_token < budget:
            wait = math.ceil(fixed / (budget - per_token))
            if limit is None or wait <= limit:
                return wait
        if limit is None:
            return self.max_probe_every
        return max(limit, math.ceil((fixed + per_token * limit) / budget))

    def probing_pays(self) -> bool:
        """Whether probes can pay for themselves: each costs the drafter's catch-up over every
        token since the last, so per off token a fixed share of a plain step. When even 95%
        acceptance would gain less than PROBE_GAIN_OVER_CATCH_UP times that share (an int4
        target here: best 1.13x, catch-up 13% of a step), probing only slows the request."""
        if not self._catch_up_per_token or not self._v0:
            return True
        # Per off token as if every one were read (not over a wait past the drafter's catch-up
        # limit): where speculation could gain this little, probes that each read a window of
        # off tokens would still cost about what they could find.
        return self._ceiling() - 1.0 > PROBE_GAIN_OVER_CATCH_UP * self._catch_up_per_token / self._v0

    def _ceiling(self) -> float:
        """The best expected speedup over every k if 95% of drafts were accepted."""
        return max(self.expected_speedup(k, acceptance=0.95) for k in range(1, self.max_k + 1))

    def verify_cost(self, k: int) -> float:
        """v(k) in seconds; until measured, assume 1 s per pass and 10% more per extra token,
        which is what bf16 on CPUs with native bf16 and GPUs roughly do."""
        v0 = self._v0 if self._v0 is not None else 1.0
        v1 = self._v1 if self._v1 is not None else 0.1 * v0
        return v0 + v1 * k

    def cost_in_plain_passes(self, k: int) -> float:
        """v(k) / v(0): what a pass verifying k drafts costs, in one-token passes."""
        return self.verify_cost(k) / self.verify_cost(0)

    def lookup_pass(self, tokens: int) -> None:
        """A pass prompt lookup drafted while speculation was off (free drafts, not this
        controller's to plan or measure): its tokens count as decoded while off, which a
        drafter that reads the target's states catches up on when it next drafts, and toward
        the wait before the next probe. Without that, lookup guessing on every off pass kept
        probes from ever running, and a request whose text turned predictable for the model
        never switched speculation back on (an edit request, 512 tokens: 1.90x -> 1.54x)."""
        self._off_since_draft += tokens
        self.k = self._count_off_steps(tokens)  # 1 (a probe) as after as many plain passes

    def _count_off_steps(self, steps: int) -> int:
        """Count ``steps`` toward the wait before the next probe: the k of the next pass, 1 (a
        probe) once the wait is over, else 0."""
        self._off_steps += steps
        if self._off_steps < self._wait:
            return 0
        self._off_steps = 0
        return 1  # probe: acceptance may have risen since speculation was switched off

    def expected_speedup(self, k: int, acceptance: float | None = None) -> float:
        a = min(self.acceptance if acceptance is None else acceptance, 0.999)
        tokens = (1 - a ** (k + 1)) / (1 - a)
        c = 0.0 if self.drafting_is_free else (self._draft_step_s or 0.0)
        return tokens * self.verify_cost(0) / (self.verify_cost(k) + k * c)

    def _choose(self, previous: int, n_accepted: int = 0) -> int:
        if self.fixed is not None:
            return self.fixed
        if previous == 0 and not self._calibrated:
            self._calibrated = True
            return self.initial_k
        if previous == 0:
            return self._count_off_steps(1)
        failed_probe = self._probing and n_accepted == 0  # while off, drafting steps are probes
        best_k, best_s = 0, 1.0
        for k in range(1, self.max_k + 1):
            s = self.expected_speedup(k)
            if s > best_s * 1.01:  # prefer shorter drafts on near-ties: less work wasted
                best_k, best_s = k, s
        # An accepted probe backs off like a rejected one when the costs alone rule speculation
        # out: no k would break even at 95% acceptance (the draft cost a probe measures includes
        # the drafter's catch-up over every token since the last probe).
        if self._probing and not failed_probe:
            failed_probe = self._ceiling() < 1.0
        if not math.isfinite(best_s):
            return previous
        if self._probing and best_s < self.resume_margin:
            best_k = 0  # a probe must show a clear gain before speculation resumes
        if best_k == 0 and not self._probing and len(self._draft_costs) < 2:
            best_k = 1  # one pass is no evidence (see _draft_costs): measure a second first
        if best_k == 0:
            # Back off: each failed probe doubles the wait before the next one; and probes
            # never cost more than ~5% of the plain steps between them (on an int4 target the
            # drafter's catch-up makes a probe cost ~3 plain steps).
            self._wait = min(self._wait * 2, self.max_probe_every) if failed_probe else self.probe_every
            if self._probe_cost and self._v0:
                self._wait = min(max(self._wait, self._affordable_wait()), self.max_probe_every)
            if not self.probing_pays():
                self._wait = self.max_probe_every
            self._probing = True
        else:
            self._wait = self.probe_every
            self._probing = False
            if self._since_plain >= REFRESH_EVERY and best_s < REFRESH_BELOW:
                self._resume_k = best_k
                return 0
        return best_k
