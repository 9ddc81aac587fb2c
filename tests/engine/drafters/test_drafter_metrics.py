"""What the benchmark reports about the drafter: step cost ratio c and head agreement."""
import pytest

from engine.bench.draft_agreement import draft_agreement, full_head_like
from engine.bench.step_costs import measure_step_costs
from engine.core.sampler import Sampler
from engine.core.settings import DecodeSettings
from engine.decode.decoding import plain_decode
from engine.drafters import DraftModelDrafter
from engine.drafters.reduced_head import ReducedHead
from engine.models.runners.runner import ModelRunner
from tests.engine.helpers import run_to_end


def target_output(target, tokenizer, prompt, n=20):
    result, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, DecodeSettings(max_new_tokens=n), set()))
    return list(result.token_ids)


def test_a_drafter_identical_to_the_target_agrees_everywhere(tiny_pair):
    tokenizer, target, _ = tiny_pair
    prompt = tokenizer("def add(a, b):")["input_ids"]
    output = target_output(target, tokenizer, prompt)
    head = ReducedHead(target.lm_head.weight, None)
    found = draft_agreement(target, head, full_head_like(head), prompt, output)
    assert found.full == found.reduced == 1.0 and found.positions == len(output)


def test_reduced_agreement_counts_the_request_tokens_the_drafter_adds(tiny_pair):
    tokenizer, target, _ = tiny_pair
    prompt = tokenizer("The quick brown fox")["input_ids"]
    output = target_output(target, tokenizer, prompt)
    # An empty base subset: only prompt tokens and output tokens already seen are proposable,
    # so a position can agree only if its token appeared before it.
    head = ReducedHead(target.lm_head.weight, [])
    found = draft_agreement(target, head, full_head_like(head), prompt, output)
    seen, possible = set(prompt), 0
    for token in output:
        possible += token in seen
        seen.add(token)
    assert found.full == 1.0
    assert found.reduced == pytest.approx(possible / len(output))
    assert draft_agreement(target, head, full_head_like(head), prompt, []) is None


def test_step_costs_are_measured_and_leave_both_runners_clean(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    runner, proposer = ModelRunner(target), DraftModelDrafter(drafter)
    context = tokenizer("for i in range(10):")["input_ids"]
    costs = measure_step_costs(runner, proposer, context, repeats=3)
    assert costs.target_ms > 0 and costs.draft_ms > 0
    assert costs.c == pytest.approx(costs.draft_ms / costs.target_ms)
    assert runner.length == 0
    # The drafter may keep its cache (prefix reuse) but must still draft correctly afterwards.
    proposer.prepare(context)
    assert len(proposer.propose(context, 2, Sampler(DecodeSettings())).tokens) == 2
