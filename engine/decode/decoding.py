"""Plain and speculative decoding as generators of events.

Both loops know nothing about chat templates or Qt: they take prompt token ids, a Runner for the
target (engine.models.runners.interface), a tokenizer (only for streaming text and stop strings) and DecodeSettings.
Cancellation is cooperative: ``cancel()`` is checked between steps.

    prefill            feed the prompt after the prefix the cache already holds (in chunks, with
                       progress and cancellation between them), choose the first token
    decode_one_token   feed the last token, choose the next (plain decoding)
    speculate_step     draft k tokens, verify them in ONE target pass, keep the accepted prefix
                       plus the target's own next token, roll both caches back
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from engine.core.events import Event, Failed, Finished, Stats, Tokens
from engine.core.sampler import Sampler
from engine.core.settings import PREFILL_CHUNK, DecodeSettings
from engine.decode import grammar
from engine.decode.draft_length import DraftLengthController
from engine.decode.grammar import GrammarConstraint
from engine.decode.output import OutputBuilder
from engine.decode.stats import StatsTracker
from engine.drafters.base import Draft, Drafter
from engine.models.runners.interface import ContextTooLong, Runner
from engine.models.runners.prefix_reuse import keep_common_prefix
from kernels.verify import verify_greedy, verify_sampled

log = logging.getLogger(__name__)



class Cancelled(Exception):
    """The request was cancelled during its prefill."""


def eos_token_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if value is None:
            continue
        ids.update(value if isinstance(value, (list, tuple, set)) else [value])
    return ids


class _Run:
    """Shared bookkeeping of one request: output, stats, the events to yield."""

    def __init__(self, target: Runner, tokenizer, prompt_ids, settings, eos_ids) -> None:
        if not prompt_ids:
            raise ValueError("the prompt is empty: type something to send")
        window = target.max_positions
        if window and len(prompt_ids) >= window:
            raise ContextTooLong(
                f"the prompt has {len(prompt_ids)} tokens but the model's context window is "
                f"{window}; shorten it"
            )
        max_new = settings.max_new_tokens
        if window:
            max_new = min(max_new, window - len(prompt_ids))
        self.output = OutputBuilder(tokenizer, eos_ids, max_new, settings.stop_strings)
        self.stats = StatsTracker(prompt_tokens=len(prompt_ids))
        self.sampler = Sampler(settings, getattr(target, "device", None))
        self.context = list(prompt_ids)
        self.constraint = (GrammarConstraint(settings.output_format, tokenizer, eos_ids)
                           if settings.output_format is not None else None)
        # Forced tokens reach the target with its next pass; drafters that read the target's
        # hidden states expect one row a committed token, so with them none are forced.
        self.forcing = True

    def emit(self, block: list[int], from_draft: list[bool], drafted: int, accepted: int, step_s: float):
        if self.constraint is not None:
            self.constraint.accept(block)
        ext = self.output.extend(block)
        self.context.extend(block)
        self.stats.add_tokens(len(ext.token_ids))
        yield Tokens(
            text=ext.text,
            token_ids=ext.token_ids,
            from_draft=tuple(from_draft[: len(ext.token_ids)]),
            drafted=drafted,
            accepted=accepted,
            step_ms=step_s * 1000,
        )
        yield Stats(self.stats.snapshot())

    def emit_forced(self):
        """Commit the tokens the grammar allows alone from here (engine.decode.grammar.forced):
        no pass chooses them; the target reads them with its next pass."""
        if self.constraint is None or self.done or not self.forcing or not grammar.COMMIT_FORCED:
            return
        forced = self.constraint.forced(self.output.max_new_tokens - len(self.output.token_ids))
        if forced:
            self.stats.forced_tokens += len(forced)
            yield from self.emit(forced, [False] * len(forced), 0, 0, 0.0)

    def unread(self, target: Runner) -> list[int]:
        """The context's tokens the target has not read yet: the last chosen one, and any
        forced ones after it."""
        return self.context[target.length:]

    @property
    def done(self) -> bool:
        return self.output.finish_reason is not None

    def finish(self, reason: str | None = None) -> Finished:
        return Finished(
            reason=reason or self.output.finish_reason or "max_new_tokens",
            stats=self.stats.snapshot(),
            token_ids=tuple(self.output.token_ids),
            text=self.output.text,
        )


class NonFiniteLogits(RuntimeError):
    """The target's first logits hold NaN or infinity: its weights (or a cache made from them)
    are damaged. Decoding them would print garbage that looks like output."""


def _model_name(target: Runner) -> str:
    model = getattr(target, "model", None)
    return str(getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "") or "the target")


def prefill(target: Runner, run: _Run, prompt_ids: list[int], kept: int | None = None,
            after_chunk: Callable[[int], None] | None = None,
            cancel: Callable[[], bool] = lambda: False) -> Iterator[Event]:
    """Feed the prompt after the prefix the target's cache already holds, in chunks of
    PREFILL_CHUNK with a Stats event (prompt tokens done / total) after each; returns the first
    chosen token (``token = yield from prefill(...)``). Raises Cancelled between chunks.
    ``kept``: the prompt's first tokens the caller left in the target's cache (None: the
    prefix it shares with the prompt). ``after_chunk(target.length)`` after each chunk but the
    last: drafters that read the target's states of every prompt position keep a chunk's
    before the next pass replaces them."""
    if kept is None:
        kept = keep_common_prefix(target, prompt_ids)
    run.stats.prefilled(kept, cached=kept)
    pending = prompt_ids[kept:]
    while len(pending) > PREFILL_CHUNK:
        if cancel():
            raise Cancelled
        target.forward(pending[:PREFILL_CHUNK])
        if after_chunk is not None:
            after_chunk(target.length)
        pending = pending[PREFILL_CHUNK:]
        run.stats.prefilled(target.length)
        yield Stats(run.stats.snapshot())
    logits = target.forward(pending)[-1]
    run.stats.prefilled(len(prompt_ids))
    # The last guard against damaged weights: one check per request, on [V] logits.
    if not torch.isfinite(logits).all():
        raise NonFiniteLogits(
            f"{_model_name(target)} computed NaN or infinite logits for the prompt: its weights (or a"
            f" cache made from them) are damaged; convert or download the model again"
        )
    if run.constraint is not None:
        logits = run.constraint.mask(logits.unsqueeze(0))[0]
    return run.sampler.choose(logits)[0]


def decode_one_token(target: Runner, unread: list[int], sampler: Sampler,
                     constraint: GrammarConstraint | None = None) -> int:
    logits = target.forward(unread)
    if constraint is not None:
        logits = constraint.mask(logits)
    return sampler.choose(logits[-1])[0]


def plain_decode(
    target: Runner,
    tokenizer,
    prompt_ids: list[int],
    settings: DecodeSettings,
    eos_ids: set[int],
    cancel: Callable[[], bool] = lambda: False,
) -> Iterator[Event]:
    """One target pass per token. The baseline, and what speculation must reproduce."""
    try:
        run = _Run(target, tokenizer, prompt_ids, settings, eos_ids)
        t = time.perf_counter()
        token = yield from prefill(target, run, prompt_ids, cancel=cancel)
        yield from run.emit([token], [False], 0, 0, time.perf_counter() - t)
        yield from run.emit_forced()
        while not run.done:
            if cancel():
                yield run.finish("cancelled")
                return
            t = time.perf_counter()
            token = decode_one_token(target, run.unread(target), run.sampler, run.constraint)
            step_s = time.perf_counter() - t
            run.stats.add_pass(0, 0, 0.0, step_s)
            yield from run.emit([token], [False], 0, 0, step_s)
            yield from run.emit_forced()
        yield run.finish()
    except Cancelled:
        yield run.finish("cancelled")
    except Exception as exc:  # the consumer (CLI, Qt worker) shows it; the engine never dies
        _log_failure("plain decoding", exc)
        yield Failed(_describe(exc))


@dataclass(frozen=True)
class Step:
    """One speculative pass: the draft, how many of its tokens the target accepted, the target's
    own token after them, and the two halves' seconds."""

    draft: Draft
    n_accepted: int
    next_token: int
    draft_s: float
    verify_s: float

    @property
    def drafted(self) -> int:
        return len(self.draft.tokens)

    @property
    def block(self) -> list[int]:
        """The tokens it commits: the accepted drafts, then the target's own."""
        return [*self.draft.tokens[: self.n_accepted], self.next_token]


def speculate_step(
    target: Runner, drafter: Drafter, context: list[int], k: int, sampler: Sampler,
    constraint: GrammarConstraint | None = None, unread: int = 1,
) -> Step:
    """Draft up to k tokens after ``context``, verify them in one target pass (its rows masked
    by ``constraint``, where the output must follow a grammar; engine.decode.grammar).

    ``unread``: how many of the context's last tokens the target has not read (the last chosen
    one, and tokens the grammar forced after it). On return the target cache holds context + the
    n accepted drafts, as the loop invariant requires.
    """
    t0 = time.perf_counter()
    draft = drafter.propose(context, k, sampler) if k > 0 else Draft(())
    t1 = time.perf_counter()
    if constraint is not None and sampler.greedy and draft.tokens:
        # A forbidden greedy draft token would be rejected: verify only the drafts before it.
        allowed = constraint.allowed_prefix(draft.tokens)
        if allowed < len(draft.tokens):
            draft = Draft(draft.tokens[:allowed], None if draft.probs is None else draft.probs[:allowed])
    if not draft.tokens:
        # Nothing to verify: the pass is a plain step and draws as plain decoding does (the
        # verification's exponential race draws a weight per vocabulary entry: 0.74 ms a pass).
        n, next_token = 0, decode_one_token(target, context[-unread:], sampler, constraint)
    else:
        drafted = torch.tensor(draft.tokens, dtype=torch.long)  # the backends move it to the logits' device
        logits = target.forward([*context[-unread:], *draft.tokens], n_logits=len(draft.tokens) + 1)
        if constraint is not None:
            logits = constraint.mask(logits, draft.tokens)
        verdict = (verify_greedy(drafted, logits) if sampler.greedy
                   else verify_sampled(drafted, draft.probs, sampler.probs(logits), sampler.generator))
        n, next_token = verdict.n_accepted, verdict.next_token
    target.crop(len(context) + n)
    drafter.observe(len(context) + n)
    return Step(draft, n, next_token, t1 - t0, time.perf_counter() - t1)


def _keep_prefix_with(target: Runner, drafter: Drafter, prompt_ids: list[int]) -> int:
    """For a drafter that reads the target's states: the prompt's first positions both keep from
    the previous request on this runner (the target's common prefix, cropped to what the
    drafter's own cache still holds valid); 0, both reset, where it keeps nothing across
    requests or last read another runner."""
    if drafter.keep_prefix is None or getattr(drafter, "target", None) is not target:
        target.reset()
        drafter.reset()
        return 0
    kept = drafter.keep_prefix(keep_common_prefix(target, prompt_ids))
    if kept == 0:
        target.reset()
    elif kept < target.length:
        target.crop(kept)
    return kept


def speculative_decode(
    target: Runner,
    drafter: Drafter,
    tokenizer,
    prompt_ids: list[int],
    settings: DecodeSettings,
    eos_ids: set[int],
    cancel: Callable[[], bool] = lambda: False,
    costs: dict | None = None,
) -> Iterator[Event]:
    """Draft, verify, accept; the output equals plain decoding's (greedy) or has its exact
    distribution (sampling). ``costs``: a dict kept by the caller across requests on the same
    models; ``costs["measured"]`` seeds the draft-length controller and is updated at the end."""
    try:
        run = _Run(target, tokenizer, prompt_ids, settings, eos_ids)
        reads_target = drafter.attach_target is not None  # the target's hidden states and K/V
        kept = _keep_prefix_with(target, drafter, prompt_ids) if reads_target else None
        if not reads_target:
            drafter.reset()
        run.forcing = not reads_target
        if drafter.follow is not None:  # a drafter that drafts under the output's grammar
            drafter.follow(run.constraint)
        if reads_target:
            drafter.attach_target(target)
        controller = DraftLengthController(fixed=settings.draft_length, max_k=settings.max_draft_length,
                                           drafting_is_free=drafter.free, known=(costs or {}).get("measured"),
                                           context_tokens=len(prompt_ids),
                                           catch_up_limit=getattr(drafter, "catch_up_limit", None))
        t = time.perf_counter()
        # Drafters that read the target's hidden states need them for every prompt position the
        # target computes: they keep each chunk's as it comes (their ``observe``).
        token = yield from prefill(target, run, prompt_ids, kept=kept,
                                   after_chunk=drafter.observe if reads_target else None, cancel=cancel)
        yield from run.emit([token], [False], 0, 0, time.perf_counter() - t)
        yield from run.emit_forced()
        # A drafter that need not draft soon reads the prompt when it first drafts: where
        # speculation does not pay, that prefill would only delay the first token.
        prefill_deferred = controller.drafter_can_wait and not reads_target
        if not run.done and not prefill_deferred:
            drafter.prepare(run.context)
        while not run.done:
            if cancel():
                yield run.finish("cancelled")
                return
            budget = run.output.max_new_tokens - len(run.output.token_ids)
            k = controller.plan(budget=budget)
            # With speculation off, prompt lookup (where it drafts beside the model) may still
            # verify a guess: it costs no drafter step.
            lookup_alone = 0
            guess_while_off = getattr(drafter, "guess_while_off", None)
            if k == 0 and controller.pass_was_off and guess_while_off is not None and budget > 1:
                lookup_alone = guess_while_off(run.context, min(controller.max_k, budget - 1), controller.cost_in_plain_passes)
            deferred_s = 0.0
            if prefill_deferred and k > 0:
                deferred_s, prefill_deferred = _timed(drafter.prepare, run.context), False
            step = speculate_step(target, drafter, run.context, k or lookup_alone, run.sampler, run.constraint,
                                  len(run.unread(target)))
            if lookup_alone:
                controller.lookup_pass(step.n_accepted + 1)
            else:
                controller.settle(step.drafted, step.n_accepted, step.verify_s, step.draft_s + deferred_s, requested=k,
                                  catch_up_s=drafter.catch_up_s, prefill_s=deferred_s + drafter.prefill_s)
            run.stats.add_pass(step.drafted, step.n_accepted, step.draft_s + deferred_s, step.verify_s,
                               off=controller.pass_was_off and not lookup_alone)
            yield from run.emit(step.block, [True] * step.n_accepted + [False], step.drafted, step.n_accepted,
                                step.draft_s + deferred_s + step.verify_s)
            yield from run.emit_forced()
        if costs is not None and controller.measured() is not None:
            costs["measured"] = controller.measured()
        yield run.finish()
    except Cancelled:
        yield run.finish("cancelled")
    except Exception as exc:
        _log_failure("speculative decoding", exc)
        yield Failed(_describe(exc))


def _timed(work: Callable[..., object], *args) -> float:
    start = time.perf_counter()
    work(*args)
    return time.perf_counter() - start


def _log_failure(what: str, exc: Exception) -> None:
    if _meant_for_the_user(exc):  # its message says it all; the consumer shows it
        log.info("%s stopped: %s", what, exc, exc_info=True)  # the traceback only with -v
    else:
        log.exception("%s failed", what)


def _meant_for_the_user(exc: Exception) -> bool:
    return isinstance(exc, (ValueError, NonFiniteLogits))  # ValueError includes ContextTooLong


def _describe(exc: Exception) -> str:
    if _meant_for_the_user(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
