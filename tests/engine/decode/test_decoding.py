"""Speculative decoding must reproduce plain decoding (greedy) token for token."""
import pytest
import torch

from engine.core.events import Failed, Finished
from engine.core.settings import DecodeSettings
from engine.decode.decoding import eos_token_ids, plain_decode, speculative_decode
from engine.drafters import DraftModelDrafter, PromptLookupDrafter
from engine.drafters.lookup_first import LookupFirstDrafter
from engine.models.runners.runner import ModelRunner
from engine.testing.tiny_models import build_model, build_tokenizer, perturbed_copy
from tests.engine.helpers import run_to_end

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n    print(i)"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def encode(tokenizer, text):
    return tokenizer(text)["input_ids"]


def plain_ids(target, tokenizer, prompt, settings, eos):
    result, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, settings, eos))
    assert isinstance(result, Finished), result
    return result


@pytest.mark.parametrize("seed", range(6))
def test_greedy_speculation_is_token_identical_to_plain(tokenizer, seed):
    target = build_model(len(tokenizer), layers=3, seed=seed)
    noise = [0.003, 0.01, 0.03][seed % 3]
    drafter = perturbed_copy(target, noise, seed=seed + 100)
    eos = eos_token_ids(target, tokenizer)
    for prompt_text in PROMPTS:
        prompt = encode(tokenizer, prompt_text)
        settings = DecodeSettings(max_new_tokens=40)
        reference = plain_ids(target, tokenizer, prompt, settings, eos)
        for k in (None, 0, 1, 2, 4, 8):
            settings = DecodeSettings(max_new_tokens=40, draft_length=k)
            for make in (lambda: DraftModelDrafter(drafter), PromptLookupDrafter,
                         lambda: LookupFirstDrafter(DraftModelDrafter(drafter), min_match=1, lookup_prior=1.5)):
                result, _ = run_to_end(
                    speculative_decode(ModelRunner(target), make(), tokenizer, prompt, settings, eos)
                )
                assert isinstance(result, Finished), result
                assert result.token_ids == reference.token_ids, (seed, prompt_text, k)
                assert result.text == reference.text


def test_a_pass_with_nothing_drafted_samples_as_plain_decoding_does(tiny_pair):
    # With no drafts a pass is a plain step: the same seed gives the same sampled tokens.
    tokenizer, target, drafter = tiny_pair
    prompt = encode(tokenizer, PROMPTS[1])
    for seed in range(3):
        sampled = dict(mode="sample", temperature=0.9, top_p=0.95, seed=seed, max_new_tokens=24)
        plain = plain_ids(target, tokenizer, prompt, DecodeSettings(**sampled), set())
        result, _ = run_to_end(speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt,
                                                  DecodeSettings(**sampled, draft_length=0), set()))
        assert isinstance(result, Finished), result
        assert result.stats.drafted == 0
        assert result.token_ids == plain.token_ids, seed


def test_partial_acceptance_is_exercised_and_counted(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    prompt = encode(tokenizer, PROMPTS[0])
    settings = DecodeSettings(max_new_tokens=60, draft_length=4)
    result, steps = run_to_end(
        speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt, settings, set())
    )
    s = result.stats
    assert 0 < s.accepted < s.drafted, "the tiny pair should accept some drafts, not all"
    assert s.acceptance == pytest.approx(s.accepted / s.drafted)
    assert len(s.acceptance_by_position) == 4
    assert s.acceptance_by_position[0] >= s.acceptance_by_position[3]
    assert sum(st.accepted for st in steps) == s.accepted
    # Tokens marked as drafted are exactly the accepted ones that were kept.
    assert sum(sum(st.from_draft) for st in steps) == s.accepted
    assert s.new_tokens == len(result.token_ids) == 60
    assert s.tokens_per_pass == pytest.approx((s.accepted + s.target_passes) / s.target_passes)


def test_eos_inside_an_accepted_block_stops_exactly_there(tiny_pair):
    tokenizer, target, _ = tiny_pair
    prompt = encode(tokenizer, PROMPTS[1])
    free_run = plain_ids(target, tokenizer, prompt, DecodeSettings(max_new_tokens=30), set())
    stop_token = free_run.token_ids[13]
    first = free_run.token_ids.index(stop_token)
    # The target drafting for itself accepts every block, so EOS lands mid-block.
    result, _ = run_to_end(
        speculative_decode(
            ModelRunner(target), DraftModelDrafter(target), tokenizer, prompt,
            DecodeSettings(max_new_tokens=30, draft_length=8), {stop_token},
        )
    )
    assert result.reason == "eos"
    assert result.token_ids == free_run.token_ids[:first]
    plain = plain_ids(target, tokenizer, prompt, DecodeSettings(max_new_tokens=30), {stop_token})
    assert plain.reason == "eos" and plain.token_ids == result.token_ids


@pytest.mark.parametrize("limit", [1, 2, 5, 9])
def test_max_new_tokens_inside_a_block_is_never_overrun(tiny_pair, limit):
    tokenizer, target, _ = tiny_pair
    prompt = encode(tokenizer, PROMPTS[0])
    settings = DecodeSettings(max_new_tokens=limit, draft_length=8)
    result, steps = run_to_end(
        speculative_decode(ModelRunner(target), DraftModelDrafter(target), tokenizer, prompt, settings, set())
    )
    assert result.reason == "max_new_tokens"
    assert len(result.token_ids) == limit == sum(len(s.token_ids) for s in steps)
    # Drafting stops at the budget too: no draft token is wasted beyond it.
    assert result.stats.drafted <= limit - 1


def test_stop_string_cuts_text_and_matches_plain(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    prompt = encode(tokenizer, PROMPTS[2])
    free_text = plain_ids(target, tokenizer, prompt, DecodeSettings(max_new_tokens=40), set()).text
    stop = free_text[20:23]
    settings = DecodeSettings(max_new_tokens=40, stop_strings=(stop,), draft_length=4)
    plain = plain_ids(target, tokenizer, prompt, settings, set())
    spec, steps = run_to_end(
        speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt, settings, set())
    )
    assert plain.reason == spec.reason == "stop_string"
    assert spec.text == plain.text == free_text[: free_text.index(stop)]
    assert "".join(s.text for s in steps) == spec.text  # streamed text never showed the stop
    assert spec.token_ids == plain.token_ids


def test_streamed_text_adds_up_to_the_final_text(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    prompt = encode(tokenizer, "Résumé 東京 🙂")
    result, steps = run_to_end(
        speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt, DecodeSettings(max_new_tokens=50), set())
    )
    assert "".join(s.text for s in steps) == result.text == tokenizer.decode(list(result.token_ids), skip_special_tokens=True)


def test_cancel_mid_run_stops_between_steps(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    seen = []
    events = speculative_decode(
        ModelRunner(target), DraftModelDrafter(drafter), tokenizer, encode(tokenizer, PROMPTS[0]),
        DecodeSettings(max_new_tokens=200, draft_length=2), set(), cancel=lambda: len(seen) >= 3,
    )
    for event in events:
        if isinstance(event, Finished):
            break
        if type(event).__name__ == "Tokens":
            seen.append(event)
    assert event.reason == "cancelled"
    assert len(seen) == 3 and 0 < len(event.token_ids) < 200


def test_overlong_prompt_is_a_clear_error(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    window = target.config.max_position_embeddings
    prompt = [5] * (window + 3)
    for events in (
        plain_decode(ModelRunner(target), tokenizer, prompt, DecodeSettings(), set()),
        speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt, DecodeSettings(), set()),
    ):
        result, _ = run_to_end(events)
        assert isinstance(result, Failed)
        assert f"{window + 3} tokens" in result.error and "context window" in result.error


def test_generation_stops_at_the_context_window(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    window = target.config.max_position_embeddings
    prompt = [5] * (window - 6)
    result, _ = run_to_end(
        speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt, DecodeSettings(max_new_tokens=50), set())
    )
    assert isinstance(result, Finished) and len(result.token_ids) == 6


def test_empty_prompt_is_a_clear_error(tiny_pair):
    tokenizer, target, _ = tiny_pair
    result, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, [], DecodeSettings(), set()))
    assert isinstance(result, Failed) and "empty" in result.error


def test_bf16_models_run_both_loops(tiny_pair):
    import copy

    tokenizer, target, drafter = tiny_pair
    # Copies: converting the shared models in place and back would round their weights to bf16
    # for every later test.
    target16, drafter16 = copy.deepcopy(target).to(torch.bfloat16), copy.deepcopy(drafter).to(torch.bfloat16)
    prompt = encode(tokenizer, PROMPTS[0])
    plain = plain_ids(target16, tokenizer, prompt, DecodeSettings(max_new_tokens=20), set())
    spec, _ = run_to_end(speculative_decode(ModelRunner(target16), DraftModelDrafter(drafter16), tokenizer, prompt, DecodeSettings(max_new_tokens=20), set()))
    assert len(plain.token_ids) == len(spec.token_ids) == 20


def test_drafter_stops_early_when_unsure_and_output_is_unchanged(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    prompt = encode(tokenizer, PROMPTS[0])
    settings = DecodeSettings(max_new_tokens=30, draft_length=6)
    reference = plain_ids(target, tokenizer, prompt, settings, set())
    never_sure = DraftModelDrafter(drafter, min_confidence=1.01)  # stops after one token
    result, steps = run_to_end(speculative_decode(ModelRunner(target), never_sure, tokenizer, prompt, settings, set()))
    assert result.token_ids == reference.token_ids
    assert all(s.drafted <= 1 for s in steps)
    always_sure = DraftModelDrafter(drafter, min_confidence=0.0)
    result, steps = run_to_end(speculative_decode(ModelRunner(target), always_sure, tokenizer, prompt, settings, set()))
    assert result.token_ids == reference.token_ids
    assert max(s.drafted for s in steps) == 6


def test_drafter_options_carry_the_confidence_cut_to_the_drafter():
    from engine.core.settings import DEFAULT_MIN_CONFIDENCE, DrafterOptions

    assert 0 < DrafterOptions().min_confidence == DEFAULT_MIN_CONFIDENCE < 1
    with pytest.raises(ValueError, match="min_confidence"):
        DrafterOptions(min_confidence=1.0)


def test_draft_lengths_are_bounded():
    from engine.core.settings import MAX_DRAFT_LENGTH

    DecodeSettings(draft_length=MAX_DRAFT_LENGTH, max_draft_length=MAX_DRAFT_LENGTH)
    with pytest.raises(ValueError, match="draft_length must be between 0 and"):
        DecodeSettings(draft_length=MAX_DRAFT_LENGTH + 1)
    with pytest.raises(ValueError, match="draft_length must be between 0 and"):
        DecodeSettings(draft_length=-1)
    with pytest.raises(ValueError, match="max_draft_length must be between 1 and"):
        DecodeSettings(max_draft_length=0)


def test_a_drafter_that_need_not_draft_reads_the_prompt_only_when_it_first_drafts(tiny_pair, monkeypatch):
    """Costs from an earlier request that rule speculation out and make probes dear (an int4
    target): the drafter skips its prompt prefill, so the first token is not delayed by it. The
    first probe (after the longest wait) prefills it then; the output stays plain decoding's.
    (The tiny target's steps take ~1 ms against the seed's 1 s: the rule that measures drafting
    again on a changed machine is held off, as on the machine that made the seed.)"""
    from engine.decode import draft_length
    from engine.decode.draft_length import MeasuredCosts

    monkeypatch.setattr(draft_length, "MACHINE_CHANGED", float("inf"))

    tokenizer, target, drafter = tiny_pair
    prompt = encode(tokenizer, PROMPTS[1])
    dear = MeasuredCosts(v0=1.0, v1=0.35, draft_step_s=0.3, acceptance=0.6, catch_up_per_token_s=0.2)
    for max_new in (40, 140):  # no probe; one probe at the 129th token
        settings = DecodeSettings(max_new_tokens=max_new)
        plain = plain_ids(target, tokenizer, prompt, settings, set())
        model_drafter = DraftModelDrafter(drafter)
        costs = {"measured": dear}
        result, _ = run_to_end(speculative_decode(ModelRunner(target), model_drafter, tokenizer, prompt, settings, set(),
                                                  costs=costs))
        assert isinstance(result, Finished), result
        assert result.token_ids == plain.token_ids
        if max_new == 40:
            assert model_drafter.runner.length == 0 and result.stats.drafted == 0
        else:
            assert result.stats.drafted >= 1 and model_drafter.runner.length > len(prompt)


def test_a_request_after_one_that_rejected_its_drafts_speculates_again(tiny_pair):
    """Costs kept across requests (Session._costs) after a request whose drafts were all
    rejected: the next request still drafts, and its output is still plain decoding's."""
    from engine.decode.draft_length import MeasuredCosts

    tokenizer, target, drafter = tiny_pair
    prompt = encode(tokenizer, PROMPTS[1])
    settings = DecodeSettings(max_new_tokens=24)
    plain = plain_ids(target, tokenizer, prompt, settings, set())
    # Dear catch-ups: seeded with that acceptance, the request would not even probe.
    costs = {"measured": MeasuredCosts(v0=1.0, v1=0.1, draft_step_s=0.1, acceptance=0.0, catch_up_per_token_s=1.5)}
    result, _ = run_to_end(speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt, settings,
                                              set(), costs=costs))
    assert isinstance(result, Finished), result
    assert result.token_ids == plain.token_ids
    assert result.stats.drafted >= 1


@pytest.mark.parametrize("case", ["calibration", "budget", "off"])
def test_only_a_pass_the_controller_chose_plain_counts_as_switched_off(tiny_pair, case):
    """Two new tokens: the prefill's and one pass with no budget left to draft. That pass counts
    as speculation switched off only where the controller had switched it off; the pass that
    calibrates v(0), or the budget's last, is not the controller's choice."""
    from engine.decode.draft_length import MeasuredCosts

    tokenizer, target, drafter = tiny_pair
    prompt = encode(tokenizer, PROMPTS[0])
    paying = MeasuredCosts(v0=1.0, v1=0.01, draft_step_s=0.01, acceptance=0.9)
    hopeless = MeasuredCosts(v0=1.0, v1=0.5, draft_step_s=1.0, acceptance=0.0)  # drafting never pays
    costs = {"calibration": None, "budget": {"measured": paying}, "off": {"measured": hopeless}}[case]
    result, _ = run_to_end(speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt,
                                              DecodeSettings(max_new_tokens=2), set(), costs=costs))
    assert isinstance(result, Finished), result
    assert result.stats.new_tokens == 2 and result.stats.drafted == 0
    assert result.stats.speculation_off_steps == (1 if case == "off" else 0)
