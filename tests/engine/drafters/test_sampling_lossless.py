"""Speculative sampling must produce the target's own distribution (statistical test).

With top-k = 3 the target's law over the first four new tokens has 81 outcomes; we compute it
exactly from the model and compare speculative samples against it with a chi-square test
(false-alarm rate 1e-4). Run for a close drafter, a far drafter, prompt lookup, prompt lookup in
front of a draft model (each step's source depends on earlier sampled tokens), and drafters
whose head covers only part of the vocabulary (their q is zero outside it, and verification must
be given that q, not the full head's), with float and int8 weights.
"""
import collections

import pytest
import torch

from engine.core.events import Finished
from engine.core.settings import DecodeSettings
from engine.decode.decoding import speculative_decode
from engine.drafters import DraftModelDrafter, PromptLookupDrafter
from engine.drafters.lookup_first import LookupFirstDrafter
from engine.drafters.reduced_head import ReducedHead
from engine.models.runners.runner import ModelRunner
from engine.quant.quantize import to_int8_drafter
from engine.testing.tiny_models import build_model, build_tokenizer, perturbed_copy
from tests import stats_helpers
from tests.stats_helpers import assert_same_distribution

TOP_K, TEMPERATURE, N_TOKENS = 3, 1.3, 4


@pytest.fixture(scope="module")
def setup():
    tokenizer = build_tokenizer()
    target = build_model(len(tokenizer), hidden=32, layers=2, seed=7)
    prompt = tokenizer("def add(a, b):")["input_ids"]
    return tokenizer, target, prompt


def exact_law(target, prompt):
    """{(t1, t2, t3): probability} under the target with the test's sampling settings."""
    return stats_helpers.exact_law(target, prompt, N_TOKENS, TEMPERATURE, TOP_K)


def pruned_drafter(target, prompt, int8):
    """A close drafter whose head keeps a random third of the vocabulary, chosen so that it
    lacks some of the target's likeliest first tokens (they can then only come from the
    verifier's residual distribution)."""
    with torch.no_grad():
        favourites = target(torch.tensor([prompt])).logits[0, -1].topk(TOP_K).indices.tolist()
    vocab = target.config.vocab_size
    subset = torch.randperm(vocab, generator=torch.Generator().manual_seed(4))[: vocab // 3].tolist()
    subset = [t for t in subset if t not in favourites[:2] and t not in prompt]
    model = perturbed_copy(target, 0.01, seed=3)
    if int8:
        model = to_int8_drafter(model)
    return DraftModelDrafter(model, head=ReducedHead(model.lm_head.weight, subset, int8=int8))


@pytest.mark.parametrize("drafter_kind", ["close", "far", "lookup", "lookup-first", "pruned", "pruned-int8"])
def test_speculative_sampling_matches_target_distribution(setup, drafter_kind):
    tokenizer, target, prompt = setup
    if drafter_kind.startswith("lookup"):
        # Every token once, so that any sampled token has an earlier occurrence to continue.
        prompt = prompt + list(range(3, len(tokenizer)))
    law = exact_law(target, prompt)
    outcomes = list(law)
    index = {o: i for i, o in enumerate(outcomes)}
    probs = torch.tensor([law[o] for o in outcomes])
    if drafter_kind == "lookup":
        drafter = PromptLookupDrafter()  # deterministic drafts: q is one-hot
    elif drafter_kind == "lookup-first":
        # 1-gram matches always exist here, so the source flips with each guess's track record.
        model = DraftModelDrafter(perturbed_copy(target, 0.3, seed=3))
        drafter = LookupFirstDrafter(model, min_match=1, model_cost=1.0, lookup_prior=1.5)
    elif drafter_kind.startswith("pruned"):
        drafter = pruned_drafter(target, prompt, int8=drafter_kind.endswith("int8"))
    else:
        noise = 0.01 if drafter_kind == "close" else 0.3
        drafter = DraftModelDrafter(perturbed_copy(target, noise, seed=3))
    runner = ModelRunner(target)
    samples, drafted, trials = [], 0, 2500
    sources = collections.Counter()  # LookupFirstDrafter's passes by source
    for seed in range(trials):
        settings = DecodeSettings(mode="sample", temperature=TEMPERATURE, top_k=TOP_K, max_new_tokens=N_TOKENS, seed=seed, draft_length=2)
        for event in speculative_decode(runner, drafter, tokenizer, prompt, settings, set()):
            if isinstance(event, Finished):
                break
        assert event.reason == "max_new_tokens", event
        drafted += event.stats.drafted
        sources.update(lookup=getattr(drafter, "lookup_steps", 0), model=getattr(drafter, "model_steps", 0))
        samples.append(index[tuple(event.token_ids)])
    assert drafted >= trials  # speculation really happened
    if drafter_kind == "lookup-first":
        assert sources["lookup"] > trials // 4 and sources["model"] > trials // 4, sources
    assert_same_distribution(torch.tensor(samples), probs)
