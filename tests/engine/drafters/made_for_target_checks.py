"""Checks that every drafter reading the target's hidden states (EAGLE-3, DFlash) must pass:
greedy output equal to plain decoding at several draft lengths, proposals equal to a fresh
drafter's after a fresh prefill of the accepted context, and sampled outcomes to hold against
the target's exact law."""
from __future__ import annotations

import copy
from typing import Callable

import torch

from engine.core.events import Finished
from engine.core.settings import DecodeSettings
from engine.decode.decoding import plain_decode, speculative_decode
from engine.models.runners.runner import ModelRunner
from tests.engine.helpers import run_to_end

PROMPTS = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog."]


def token_ids(tokenizer, text) -> list[int]:
    return tokenizer(text)["input_ids"]


def assert_greedy_is_plain(drafter, target, tokenizer, draft_lengths, label) -> None:
    for text in PROMPTS:
        prompt = token_ids(tokenizer, text)
        plain, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, DecodeSettings(max_new_tokens=32), set()))
        for k in draft_lengths:
            result, _ = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, prompt,
                                                      DecodeSettings(max_new_tokens=32, draft_length=k), set()))
            assert isinstance(result, Finished), result
            assert result.token_ids == plain.token_ids, (label, text, k)
            assert result.stats.drafted > 0


def fresh_proposal(fresh_drafter, target_model, context, k, sampler):
    """What ``fresh_drafter`` proposes after a fresh prefill of ``context``, drawing from a
    generator of its own in the state of ``sampler``'s (the same draws)."""
    fresh_runner = ModelRunner(target_model)
    fresh_drafter.attach_target(fresh_runner)
    fresh_runner.forward(context[:-1])
    fresh_drafter.prepare(context)
    twin = copy.copy(sampler)
    twin.generator = torch.Generator()
    twin.generator.set_state(sampler.generator.get_state())
    return fresh_drafter.propose(context, k, twin)


def rechecked(drafter_class: type, fresh: Callable):
    """A subclass of ``drafter_class`` whose every proposal must equal that of ``fresh(self)``
    (a new drafter of the same weights) after a fresh prefill of the accepted context, the same
    tokens and q: its cache and kept states follow acceptances and rollbacks. ``checks`` counts
    the proposals checked."""

    class Rechecked(drafter_class):
        checks = 0

        def propose(self, context, k, sampler):
            expected = fresh_proposal(fresh(self), self.target.model, context, k, sampler)
            draft = super().propose(context, k, sampler)
            assert draft.tokens == expected.tokens, (len(context), draft.tokens, expected.tokens)
            if draft.probs is not None:
                torch.testing.assert_close(draft.probs, expected.probs, atol=1e-5, rtol=1e-4)
            self.checks += 1
            return draft

    return Rechecked


def sampled_outcomes(drafter, target, tokenizer, law, *, trials, temperature, top_k, n_tokens, draft_length):
    """Index into ``law`` of each of ``trials`` seeded speculative samples, and the drafted and
    accepted counts over them."""
    prompt = token_ids(tokenizer, PROMPTS[0])
    index = {o: i for i, o in enumerate(law)}
    runner = ModelRunner(target)
    samples, drafted, accepted = [], 0, 0
    for seed in range(trials):
        settings = DecodeSettings(mode="sample", temperature=temperature, top_k=top_k, max_new_tokens=n_tokens, seed=seed,
                                  draft_length=draft_length)
        result, _ = run_to_end(speculative_decode(runner, drafter, tokenizer, prompt, settings, set()))
        drafted += result.stats.drafted
        accepted += result.stats.accepted
        samples.append(index[result.token_ids])
    return torch.tensor(samples), drafted, accepted


def _finished(events) -> Finished:
    last = [e for e in events if isinstance(e, Finished)]
    assert last, "the request did not finish"
    return last[0]


def assert_turns_reuse_the_prefix(session, tokenizer, settings: DecodeSettings) -> None:
    """A conversation through the session with a drafter made for the target: the second turn
    (the first prompt, its reply, a new message) prefills only what it adds; a third turn whose
    start was edited prefills (nearly) all of it; every turn's output is plain decoding's on a
    fresh cache."""
    p1 = token_ids(tokenizer, PROMPTS[0])
    r1 = _finished(session.speculative(p1, settings))
    p2 = p1 + list(r1.token_ids) + token_ids(tokenizer, PROMPTS[1])
    r2 = _finished(session.speculative(p2, settings))
    p3 = [p2[0], (p2[1] + 1) % len(tokenizer)] + p2[2:]
    r3 = _finished(session.speculative(p3, settings))
    assert len(p1) <= r2.stats.cached_tokens < len(p2)
    assert r3.stats.cached_tokens <= 1
    assert r2.stats.drafted > 0 and r3.stats.drafted > 0
    for prompt, spec in ((p1, r1), (p2, r2), (p3, r3)):
        session.forget_prefixes()
        plain = _finished(session.plain(prompt, settings))
        assert spec.token_ids == plain.token_ids
