"""A separate, smaller model with the target's tokenizer drafts k tokens autoregressively."""
from __future__ import annotations

import time

import torch

from engine.core.sampler import Sampler
from engine.core.settings import PREFILL_CHUNK
from engine.drafters.base import Draft, DrafterBase
from engine.drafters.reduced_head import ReducedHead
from engine.models.runners import gguf_runner
from engine.models.runners.fused_runner import DRAFTER_KV_DTYPE, FusedRunner, worth_using
from engine.models.runners.prefix_reuse import common_prefix
from engine.models.runners.runner import ModelRunner

#: The most prompt tokens a drafter prefills for one request. Its prefill is paid before it drafts,
#: after the first token: ~2.7 ms a token for the default int4 drafter on 2 cores of an AVX-512
#: EPYC, 85 ms for 32 tokens, 170 ms for 64 (4-5% of a 96-token reply at 4k tokens of context),
#: and 512 tokens cost more than speculation saves on a ~100-token reply (the long code prompts
#: ran 0.75-1.01x of plain with 512, 0.88-0.92x with 128 on fresh code). What it reads barely
#: changes how often it agrees with the target: teacher-forced top-1 along the target's greedy
#: replies (256 tokens) to the three long code prompts, 0.588 / 0.369 / 0.745 with 16 tokens,
#: 0.604 / 0.376 / 0.729 with 32, 0.624 / 0.369 / 0.729 with 64 (means 0.567 / 0.570 / 0.574:
#: one token in 250 for 85 ms more). Its cache then starts at that point of the prompt; rotary
#: positions are relative, so it drafts from its window as from a whole prompt, only without the
#: text before it (prompt lookup still copies from all of it).
DRAFT_WINDOW = 32


class DraftModelDrafter(DrafterBase):
    """``head``: a ReducedHead to draft from instead of the model's own LM head (a token subset
    and/or int8 rows: a cheaper step). None uses the model's head over the whole vocabulary.
    ``fused``: run an int8 drafter's layers one kernel call each (FusedRunner); None decides.

    ``min_confidence``: stop drafting early when the drafter's probability of its own
    token falls below it (such tokens are usually rejected, and every draft step costs a drafter
    pass). How many tokens are proposed may depend on the drafter's state without breaking
    losslessness: each proposed token is still drawn from q and verified against p. Off by
    default: with 0.4 (transformers' default) the default pair measured slower on code prompts
    (1.26x vs 1.39x on code-fib), as the adaptive k already limits wasted drafts."""

    free = False

    def __init__(self, model, name: str = "draft model", min_confidence: float = 0.0, head: ReducedHead | None = None,
                 fused: bool | None = None) -> None:
        use_fused = worth_using(model) if fused is None else fused
        if use_fused:
            self.runner = FusedRunner(model, huge_pages=True, kv_dtype=DRAFTER_KV_DTYPE)
        elif fused is None and gguf_runner.unsupported_reason(model) is None:  # a GGUF drafter
            self.runner = gguf_runner.GgufRunner(model)
        else:
            self.runner = ModelRunner(model)
        self.name = name
        self.min_confidence = min_confidence
        self.head = head
        self.grammar = None  # the request's output grammar, when it has one (follow)
        self._seen = 0  # context tokens already offered to the head
        #: Seconds of the last propose() spent catching up on tokens the drafter had not seen
        #: (after speculation was off): a cost of switching back on, not of drafting.
        self.catch_up_s = 0.0
        self._step_s: float | None = None  # a one-token draft step, as measured
        self._cached: list[int] = []  # the tokens whose keys/values the runner's cache holds
        # The request's position of the cache's first token (see DRAFT_WINDOW), and the tokens
        # before it, which a later prompt must repeat for the cache to stay valid.
        self._origin = 0
        self._skipped: list[int] = []

    def follow(self, grammar) -> None:
        """Draft under ``grammar`` (engine.decode.grammar.GrammarConstraint) for this request:
        every draft token one it allows. None: draft freely."""
        self.grammar = grammar

    def reset(self) -> None:
        # The cache is kept: prepare() reuses whatever prefix the next prompt shares with it.
        # The grammar too: speculative decoding sets it (or None) for each request.
        self._seen = 0
        if self.head is not None:
            self.head.reset()

    def forget(self) -> None:
        """Drop the cached prefix too: the next prompt is prefilled whole (a benchmark's run)."""
        self.reset()
        self._restart(0, [])

    def prepare(self, prompt: list[int]) -> None:
        """Prefill the drafter with the prompt, reusing the cached prefix it shares with the
        previous request (the chat template's system prompt, earlier turns of a chat): a
        drafter prefill is paid before the first draft and is not cheap at int8 either. More
        than DRAFT_WINDOW new tokens (a pasted file, a new long conversation): only the last
        DRAFT_WINDOW of them are read."""
        self.reset()
        self._offer(prompt)
        body = prompt[:-1]
        if body[: self._origin] != self._skipped:
            self._restart(0, [])
        common = common_prefix(self._cached, body[self._origin :])
        if len(body) - self._origin - common > DRAFT_WINDOW:
            self._restart_at_window(body)
            common = 0
        self._crop(common)
        body = body[self._origin :]
        # Only the cache is wanted here: skip the LM head entirely. In chunks, as the target's
        # prefill: a pasted file's activations stay one chunk's.
        for start in range(common, len(body), PREFILL_CHUNK):
            self._feed_hidden(body[start : start + PREFILL_CHUNK])

    @property
    def catch_up_limit(self) -> int:
        return DRAFT_WINDOW + 1

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        if k <= 0:
            return Draft(())
        self._offer(context)
        # Feed whatever the drafter has not seen yet: after a full acceptance that is the last
        # draft token plus the target's bonus token, otherwise just the target's token.
        pending = context[self._origin + self.runner.length :]
        if len(pending) > self.catch_up_limit:
            # A long stretch decoded while speculation was off: read its last window only, as a
            # long prompt's (DRAFT_WINDOW). Reading every token made a probe after 128 off
            # tokens cost ~320 ms on 2 cores, and so every probe wait the longest.
            pending = context[self._restart_at_window(context[:-1]) :]
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        self.catch_up_s = 0.0
        try:
            for i in range(k):
                start = time.perf_counter()
                step = self._next(pending, sampler, want_confidence=i > 0 and self.min_confidence > 0)
                self._time_step(len(pending), time.perf_counter() - start)
                if step is None:  # the grammar allows none of the tokens this drafter can write
                    break
                token, dist, confidence = step
                if confidence is not None and confidence < self.min_confidence:
                    # The cache already holds every proposed token; observe() crops
                    # whatever verification rejects.
                    break
                if self.grammar is not None and not self.grammar.draft_token(token):
                    break
                tokens.append(token)
                if dist is not None:
                    dists.append(dist)
                pending = [token]
        finally:
            if self.grammar is not None:
                self.grammar.end_draft()
        # The last draft token is not fed: it is only needed if accepted, and then it is fed
        # together with the bonus token in the next round.
        probs = torch.stack(dists) if dists else None
        return Draft(tuple(tokens), probs)

    def _time_step(self, fed: int, seconds: float) -> None:
        if fed <= 2:  # a normal step: the target's token, perhaps with the last accepted draft
            self._step_s = seconds if self._step_s is None else 0.8 * self._step_s + 0.2 * seconds
        else:  # caught up on fed - 1 tokens first
            step = self._step_s if self._step_s is not None else seconds / fed
            self.catch_up_s += max(0.0, seconds - step)

    def observe(self, valid_length: int) -> None:
        self._crop(max(0, valid_length - self._origin))

    def _restart_at_window(self, body: list[int]) -> int:
        """An empty cache that will read the last DRAFT_WINDOW tokens of ``body`` (the tokens
        before the last one, which the next draft step feeds): returns its origin."""
        origin = len(body) - DRAFT_WINDOW
        self._restart(origin, body[:origin])
        return origin

    def _restart(self, origin: int, skipped: list[int]) -> None:
        """An empty cache whose first token will be the request's token at ``origin``."""
        self._crop(0)
        self._origin, self._skipped = origin, list(skipped)

    def _crop(self, length: int) -> None:
        self.runner.crop(length)
        del self._cached[length:]

    def _feed_hidden(self, tokens: list[int]) -> torch.Tensor:
        hidden = self.runner.forward_hidden(tokens)
        self._cached.extend(tokens)
        return hidden

    def _next(self, pending: list[int], sampler: Sampler, want_confidence: bool) -> tuple[int, torch.Tensor | None, float | None] | None:
        """One drafter step: (token, the full-vocabulary q it was drawn from or None when
        greedy, its probability under the drafter when asked for); under a grammar the logits
        are masked to what it allows (None: it allows none of them)."""
        if self.head is None:
            logits = self.runner.forward(pending)[-1]
            self._cached.extend(pending)
            logits = self._guided(logits, None)
            if logits is None:
                return None
            token, dist = sampler.choose(logits)
            confidence = float((dist if dist is not None else logits.softmax(-1))[token]) if want_confidence else None
            return token, dist, confidence
        logits = self._guided(self.head.logits(self._feed_hidden(pending)[-1]), self.head.ids)
        if logits is None:
            return None
        index, sub_dist = sampler.choose(logits)
        confidence = float((sub_dist if sub_dist is not None else logits.softmax(-1))[index]) if want_confidence else None
        # q must be the distribution actually sampled from: the subset's, zero elsewhere.
        dist = self.head.to_vocab(sub_dist) if sub_dist is not None else None
        return self.head.token(index), dist, confidence

    def _guided(self, logits: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor | None:
        """``logits`` (over the vocabulary, or over the head's ``ids``) masked by the grammar."""
        if self.grammar is None:
            return logits
        allowed = self.grammar.draft_mask(logits.shape[-1] if ids is None else self.head.vocab_size)
        if allowed is None:
            return logits
        allowed = allowed if ids is None else allowed[ids]
        if not bool(allowed.any()):
            return None
        return logits.masked_fill(~allowed.to(logits.device), float("-inf"))

    def _offer(self, context: list[int]) -> None:
        """Tokens of the request not yet offered to the head become proposable."""
        if self.head is not None and len(context) > self._seen:
            self.head.include(context[self._seen :])
        self._seen = len(context)
