"""Choosing the draft length k per step from measured costs and observed acceptance.

Model (Leviathan et al., sec. 3.4): with per-token acceptance rate a, a pass that drafts k tokens
yields E[tokens] = (1 - a^(k+1)) / (1 - a). It costs k drafter steps (c seconds each) plus one
target pass over k+1 tokens, v(k) = v0 + v1*k (fitted from measured passes). The speedup over
plain decoding (one token per v(0)) is S(k) = E[tokens] * v(0) / (v(k) + k*c). We pick the k that
maximises S and draft nothing (k = 0) when no k is expected to beat plain decoding; after a while
we probe again with k = 1 so a request whose text becomes predictable regains speculation.
"""
from __future__ import annotations

import math


class DraftLengthController:
    def __init__(
        self,
        fixed: int | None = None,
        max_k: int = 8,
        initial_k: int = 4,
        prior_acceptance: float = 0.7,
        decay: float = 0.9,
        probe_every: int = 16,
        drafting_is_free: bool = False,
    ) -> None:
        self.fixed = fixed
        self.max_k = max_k
        self.k = min(initial_k, max_k)
        self.decay = decay
        self.probe_every = probe_every
        self.drafting_is_free = drafting_is_free
        # Acceptance as decayed counts of (accepted, tried) draft positions, seeded by a prior.
        self._acc = prior_acceptance * 4
        self._tries = 4.0
        self._draft_step_s: float | None = None
        # Decayed least-squares sums for v(k) = v0 + v1*k over observed (k, seconds).
        self._w = self._sk = self._skk = self._sv = self._skv = 0.0
        self._off_steps = 0

    @property
    def acceptance(self) -> float:
        return self._acc / self._tries

    def next_k(self) -> int:
        if self.fixed is not None:
            return self.fixed
        return self.k

    def record(
        self, k: int, n_accepted: int, verify_s: float, draft_s: float, requested: int | None = None
    ) -> None:
        """Update from one step: k drafted (of ``requested``), n accepted, and the timings of
        its two halves. A drafter may propose fewer than requested (prompt lookup with no
        match); only a requested k of 0 means speculation was switched off."""
        d = self.decay
        if k > 0:
            tried = n_accepted + (1 if n_accepted < k else 0)
            self._acc = d * self._acc + n_accepted
            self._tries = d * self._tries + tried
            per_step = draft_s / k
            self._draft_step_s = (
                per_step if self._draft_step_s is None else d * self._draft_step_s + (1 - d) * per_step
            )
        self._w = d * self._w + 1
        self._sk = d * self._sk + k
        self._skk = d * self._skk + k * k
        self._sv = d * self._sv + verify_s
        self._skv = d * self._skv + k * verify_s
        self.k = self._choose(previous=k if requested is None else requested)

    def verify_cost(self, k: int) -> float:
        """Fitted v(k). Until two different k have been seen, assume verifying k+1 tokens costs
        10% more per extra token than one, which is conservative for bf16 on CPU and GPUs."""
        mean_k = self._sk / self._w
        mean_v = self._sv / self._w
        var_k = self._skk / self._w - mean_k**2
        if var_k > 0.25:
            slope = (self._skv / self._w - mean_k * mean_v) / var_k
            slope = max(slope, 0.0)
            base = max(mean_v - slope * mean_k, 1e-6)
        else:
            base = mean_v / (1 + 0.1 * mean_k)
            slope = 0.1 * base
        return base + slope * k

    def expected_speedup(self, k: int) -> float:
        a = min(self.acceptance, 0.999)
        tokens = (1 - a ** (k + 1)) / (1 - a)
        c = 0.0 if self.drafting_is_free else (self._draft_step_s or 0.0)
        return tokens * self.verify_cost(0) / (self.verify_cost(k) + k * c)

    def _choose(self, previous: int) -> int:
        if self.fixed is not None:
            return self.fixed
        if previous == 0:
            self._off_steps += 1
            if self._off_steps % self.probe_every:
                return 0
            return 1  # probe: acceptance may have risen since speculation was switched off
        best_k, best_s = 0, 1.0
        for k in range(1, self.max_k + 1):
            s = self.expected_speedup(k)
            if s > best_s * 1.01:  # prefer shorter drafts on near-ties: less work wasted
                best_k, best_s = k, s
        if not math.isfinite(best_s):
            return previous
        return best_k
