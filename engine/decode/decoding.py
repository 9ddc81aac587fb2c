"""Plain and speculative decoding as generators of events.

Both loops know nothing about chat templates or Qt: they take prompt token ids, a ModelRunner for
the target, a tokenizer (only for streaming text and stop strings) and DecodeSettings.
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

import torch

from engine.core.events import Event, Failed, Finished, Stats, Tokens
from engine.core.sampler import Sampler
from engine.core.settings import PREFILL_CHUNK, DecodeSettings
from engine.decode.draft_length import DraftLengthController
from engine.decode import grammar
from engine.decode.grammar import GrammarConstraint
from engine.decode.output import OutputBuilder
from engine.decode.stats import StatsTracker
from engine.drafters.base import Draft, Drafter
from engine.models.prefix_reuse import keep_common_prefix
from engine.models.runner import ContextTooLong, ModelRunner
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

    def __init__(self, target: ModelRunner, tokenizer, prompt_ids, settings, eos_ids) -> None:
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

    def unread(self, target: ModelRunner) -> list[int]:
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


def _model_name(target: ModelRunner) -> str:
    model = getattr(target, "model", None)
    return str(getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "") or "the target")


def prefill(target: ModelRunner, run: _Run, prompt_ids: list[int], whole: bool = False,
            cancel: Callable[[], bool] = lambda: False) -> Iterator[Event]:
    """Feed the prompt after the prefix the target's cache already holds, in chunks of
    PREFILL_CHUNK with a Stats event (prompt tokens done / total) after each; returns the first
    chosen token (``token = yield from prefill(...)``). Raises Cancelled between chunks.
    ``whole``: the whole prompt in one pass on an empty cache (for drafters that read the
    target's hidden states of every prompt position from its prefill)."""
    if whole:
        target.reset()
    kept = 0 if whole else keep_common_prefix(target, prompt_ids)
    run.stats.prefilled(kept, cached=kept)
    pending = prompt_ids[kept:]
    while not whole and len(pending) > PREFILL_CHUNK:
        if cancel():
            raise Cancelled
        target.forward(pending[:PREFILL_CHUNK])
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


def decode_one_token(target: ModelRunner, unread: list[int], sampler: Sampler,
                     constraint: GrammarConstraint | None = None) -> int:
    logits = target.forward(unread)
    if constraint is not None:
        logits = constraint.mask(logits)
    return sampler.choose(logits[-1])[0]


def plain_decode(
    target: ModelRunner,
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


def speculate_step(
    target: ModelRunner, drafter: Drafter, context: list[int], k: int, sampler: Sampler,
    constraint: GrammarConstraint | None = None, unread: int = 1,
) -> tuple[Draft, int, int, float, float]:
    """Draft up to k tokens after ``context``, verify them in one target pass (its rows masked
    by ``constraint``, where the output must follow a grammar; engine.decode.grammar).

    ``unread``: how many of the context's last tokens the target has not read (the last chosen
    one, and tokens the grammar forced after it). Returns (draft, n_accepted, next_token,
    draft_seconds, verify_seconds). On return the target cache holds context + the n accepted
    drafts, as the loop invariant requires.
    """
    t0 = time.perf_counter()
    draft = drafter.propose(context, k, sampler) if k > 0 else Draft(())
    t1 = time.perf_counter()
    if constraint is not None and sampler.greedy and draft.tokens:
        # A forbidden greedy draft token would be rejected: verify only the drafts before it.
        allowed = constraint.allowed_prefix(draft.tokens)
        if allowed < len(draft.tokens):
            draft = Draft(draft.tokens[:allowed], None if draft.probs is None else draft.probs[:allowed])
    drafted = torch.tensor(draft.tokens, dtype=torch.long)  # the backends move it to the logits' device
    logits = target.forward([*context[-unread:], *draft.tokens], n_logits=len(draft.tokens) + 1)
    if constraint is not None:
        logits = constraint.mask(logits, draft.tokens)
    if sampler.greedy:
        verdict = verify_greedy(drafted, logits)
    else:
        verdict = verify_sampled(drafted, draft.probs, sampler.probs(logits), sampler.generator)
    n = verdict.n_accepted
    target.crop(len(context) + n)
    drafter.observe(len(context) + n)
    return draft, n, verdict.next_token, t1 - t0, time.perf_counter() - t1


def speculative_decode(
    target: ModelRunner,
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
        drafter.reset()
        attach = getattr(drafter, "attach_target", None)
        run.forcing = attach is None
        follow = getattr(drafter, "follow", None)
        if follow is not None:  # a drafter that drafts under the output's grammar
            follow(run.constraint)
        if attach is not None:  # drafters that read the target's hidden states and K/V
            attach(target)
        controller = DraftLengthController(
            fixed=settings.draft_length,
            max_k=settings.max_draft_length,
            drafting_is_free=drafter.free,
            known=(costs or {}).get("measured"),
        )
        t = time.perf_counter()
        # Drafters that read the target's hidden states need them for the whole prompt.
        token = yield from prefill(target, run, prompt_ids, whole=attach is not None, cancel=cancel)
        yield from run.emit([token], [False], 0, 0, time.perf_counter() - t)
        yield from run.emit_forced()
        # A drafter that need not draft soon reads the prompt when it first drafts (its catch-up
        # then): on a target where speculation does not pay, that prefill only delayed the
        # first token. Drafters reading the target's own states must start from its prefill.
        deferred = controller.drafter_can_wait and attach is None
        if not run.done and not deferred:
            drafter.prepare(run.context)
        while not run.done:
            if cancel():
                yield run.finish("cancelled")
                return
            remaining = run.output.max_new_tokens - len(run.output.token_ids)
            # Never draft past the token budget: the target adds one token of its own.
            requested = max(0, min(controller.next_k(), remaining - 1))
            # Only the controller's own choice counts as speculation switching itself off: not its
            # calibration or v(0) refresh passes, nor a last pass with no budget left to draft.
            switched_off = controller.switched_off
            prepare_s = 0.0
            if deferred and requested > 0:
                t = time.perf_counter()
                drafter.prepare(run.context)
                prepare_s, deferred = time.perf_counter() - t, False
            draft, n, next_token, draft_s, verify_s = speculate_step(
                target, drafter, run.context, requested, run.sampler, run.constraint, len(run.unread(target))
            )
            k = len(draft.tokens)
            # The controller prices drafting per token: a catch-up on tokens decoded while
            # speculation was off is a one-off cost of switching on (the run's stats keep it).
            # A deferred prompt prefill is one too.
            catch_up_s = min(draft_s, getattr(drafter, "catch_up_s", 0.0)) + prepare_s
            draft_s += prepare_s
            controller.record(k, n, verify_s, draft_s - catch_up_s, requested=requested, catch_up_s=catch_up_s)
            run.stats.add_pass(k, n, draft_s, verify_s)
            if switched_off:
                run.stats.off_steps += 1
            block = [*draft.tokens[:n], next_token]
            yield from run.emit(block, [True] * n + [False], k, n, draft_s + verify_s)
            yield from run.emit_forced()
        if costs is not None and controller.measured() is not None:
            costs["measured"] = controller.measured()
        yield run.finish()
    except Cancelled:
        yield run.finish("cancelled")
    except Exception as exc:
        _log_failure("speculative decoding", exc)
        yield Failed(_describe(exc))


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
