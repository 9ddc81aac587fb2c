"""Gemma 4 assistant (MTP) drafter in our loop: lossless, read the right state, refuse misfits.

Tiny random Gemma 4 models (engine.testing.tiny_gemma4): an E2B-like Gemma4ForCausalLM with per-layer
embeddings and KV-shared layers, and a 26B/31B-like text-only Gemma4ForConditionalGeneration
(keys = values on full attention, MoE block); both assistants have the centroid-masked head.
Sliding window 8 with ~13-token prompts, so every run crosses the window.
"""
import copy

import pytest
import torch

from engine.core.events import Finished
from engine.core.sampler import Sampler
from engine.core.settings import DecodeSettings
from engine.decode.decoding import eos_token_ids, plain_decode, speculative_decode
from engine.drafters import AssistantMismatch, DrafterMismatch, Gemma4AssistantDrafter, PromptLookupDrafter
from engine.drafters.assistant_fit import check_assistant_fits
from engine.models.runners.runner import ModelRunner
from engine.testing.tiny_gemma4 import assistant_config, build_gemma4_assistant, build_gemma4_target, padded_vocab
from engine.testing.tiny_models import build_tokenizer
from tests import stats_helpers
from tests.engine.helpers import run_to_end
from tests.stats_helpers import assert_same_distribution

PROMPTS = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog."]
NEW = 24


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny models are dominated by per-op overhead; a second thread only adds contention.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def pairs(tokenizer):
    """{layout: (target, assistant)} in float32."""
    vocab = padded_vocab(len(tokenizer))
    out = {}
    for layout in ("e2b", "dense"):
        target = build_gemma4_target(vocab, layout)
        out[layout] = (target, build_gemma4_assistant(target))
    return out


def pair(pairs, layout, dtype):
    target, assistant = pairs[layout]
    if dtype == torch.float32:
        return target, assistant
    return copy.deepcopy(target).to(dtype), copy.deepcopy(assistant).to(dtype)


def ids(tokenizer, text):
    return tokenizer(text)["input_ids"]


def plain_ids(target, tokenizer, prompt, eos, new=NEW):
    result, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, DecodeSettings(max_new_tokens=new), eos))
    assert isinstance(result, Finished), result
    return result.token_ids


def speculative(target, drafter, tokenizer, prompt, settings, eos=frozenset()):
    result, steps = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, prompt, settings, set(eos)))
    assert isinstance(result, Finished), result
    return result, steps


def transformers_greedy(target, prompt, new, assistant=None, k=None):
    """transformers' own generate (the oracle), plain or assisted with k drafts per step."""
    kwargs = {}
    if assistant is not None:
        assistant.generation_config.num_assistant_tokens = k
        kwargs["assistant_model"] = assistant
    with torch.inference_mode():
        out = target.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, **kwargs)
    generated = out[0, len(prompt):].tolist()
    eos = target.generation_config.eos_token_id
    return tuple(generated[: generated.index(eos)] if eos in generated else generated)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["e2b", "dense"])
def test_greedy_matches_plain_and_transformers_generate(tokenizer, pairs, layout, dtype):
    target, assistant = pair(pairs, layout, dtype)
    eos = eos_token_ids(target, tokenizer)
    for text in PROMPTS:
        prompt = ids(tokenizer, text)
        reference = plain_ids(target, tokenizer, prompt, eos)
        assert transformers_greedy(target, prompt, NEW) == reference, "our plain loop == transformers' plain"
        for k in (1, 2, 4, None):
            drafter = Gemma4AssistantDrafter(assistant, target)
            result, _ = speculative(target, drafter, tokenizer, prompt, DecodeSettings(max_new_tokens=NEW, draft_length=k), eos)
            assert result.token_ids == reference, (layout, text, k)
            if k is not None:
                assert transformers_greedy(target, prompt, NEW, assistant, k) == reference, (layout, text, k)


def test_acceptance_is_partial_and_reported(tokenizer, pairs):
    target, assistant = pairs["e2b"]
    prompt = ids(tokenizer, PROMPTS[0])
    settings = DecodeSettings(max_new_tokens=40, draft_length=4)
    result, steps = speculative(target, Gemma4AssistantDrafter(assistant, target), tokenizer, prompt, settings)
    s = result.stats
    assert 0 < s.accepted < s.drafted, "the steered tiny pair accepts some drafts, not all"
    assert s.acceptance == pytest.approx(s.accepted / s.drafted)
    assert len(s.acceptance_by_position) == 4 and s.acceptance_by_position[0] > 0
    assert sum(sum(st.from_draft) for st in steps) == s.accepted
    assert s.tokens_per_pass > 1


def test_first_drafts_match_transformers_candidate_generator(tokenizer, pairs):
    """Our draft step is transformers' SinglePositionMultiTokenCandidateGenerator's: same tokens
    for k = 4 greedy, same distribution q for the first token. (Prompt shorter than the window,
    where the two read exactly the same K/V.)"""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

    for layout in ("e2b", "dense"):
        target, assistant = pairs[layout]
        prompt = ids(tokenizer, "def add(a, b)")[:6]
        with torch.inference_mode():
            out = target(input_ids=torch.tensor([prompt]), return_shared_kv_states=True, output_hidden_states=True)
        first = int(out.logits[0, -1].argmax())
        assistant.generation_config.num_assistant_tokens = 4
        oracle = SinglePositionMultiTokenCandidateGenerator(assistant, target.get_input_embeddings(), GenerationConfig(max_length=100))
        with torch.inference_mode():
            cand, cand_logits = oracle.get_candidates(
                torch.tensor([prompt + [first]]), model_kwargs={"attention_mask": torch.ones(1, len(prompt) + 1, dtype=torch.long)},
                model_outputs=out, is_first_iteration=False, n_last_matches=0,
            )
        runner = ModelRunner(target)
        drafter = Gemma4AssistantDrafter(assistant, target)
        drafter.attach_target(runner)
        ours = runner.forward(prompt)[-1]
        assert int(ours.argmax()) == first
        draft = drafter.propose(prompt + [first], 4, Sampler(DecodeSettings()))
        assert list(draft.tokens) == cand[0, len(prompt) + 1:].tolist(), layout
        q = drafter.propose(prompt + [first], 1, Sampler(DecodeSettings(mode="sample", temperature=1.0))).probs[0]
        torch.testing.assert_close(q, cand_logits[0, 0].float().softmax(-1), atol=1e-5, rtol=1e-4)


class RecheckedAssistant(Gemma4AssistantDrafter):
    """Before every proposal, compares what the drafter reads from the loop's target runner
    (after its verifications and rollbacks) with a fresh prefill of the accepted context."""

    checks = 0

    def propose(self, context, k, sampler):
        fresh = ModelRunner(self.target.model)
        fresh.capture_hidden = True
        fresh.forward(context[:-1])
        position = len(context) - 1
        torch.testing.assert_close(self.target.hidden_at(position - 1), fresh.hidden_at(position - 1), atol=1e-4, rtol=1e-4)
        loop_kv = self.shared_kv()
        live, self.target = self.target, fresh
        try:
            fresh_kv = self.shared_kv()
            expected = super().propose(context, k, sampler)
        finally:
            self.target = live
        window = self.shared.sliding_window
        for layer_type in loop_kv:
            seen = min(position, window - 1) if layer_type == "sliding_attention" else position
            assert loop_kv[layer_type][0].shape[2] == seen, (layer_type, position)
            for a, b in zip(loop_kv[layer_type], fresh_kv[layer_type]):
                assert a.shape == b.shape, layer_type
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        draft = super().propose(context, k, sampler)
        assert draft.tokens == expected.tokens
        self.checks += 1
        return draft


@pytest.mark.parametrize("layout", ["e2b", "dense"])
def test_drafts_read_the_state_of_the_accepted_context_only(tokenizer, pairs, layout):
    """After any mix of acceptances and rejections (and past the sliding window), the hidden
    state and K/V the assistant reads equal those of a fresh pass over the accepted tokens."""
    target, assistant = pairs[layout]
    drafter = RecheckedAssistant(assistant, target)
    settings = DecodeSettings(max_new_tokens=30, draft_length=3)
    result, _ = speculative(target, drafter, tokenizer, ids(tokenizer, PROMPTS[1]), settings)
    assert drafter.checks >= 8 and 0 < result.stats.accepted < result.stats.drafted


def test_gemma4_target_rolls_back_past_its_sliding_window_with_other_drafters(tokenizer, pairs):
    """The runner records sliding-window states until a pass is final, so any drafter can roll
    a Gemma 4 target back after the window is full."""
    target, _ = pairs["e2b"]
    prompt = ids(tokenizer, PROMPTS[0] * 2)
    assert len(prompt) > 2 * target.config.sliding_window
    reference = plain_ids(target, tokenizer, prompt, set(), new=20)
    result, _ = speculative(target, PromptLookupDrafter(), tokenizer, prompt, DecodeSettings(max_new_tokens=20, draft_length=4))
    assert result.token_ids == reference
    assert result.stats.drafted > result.stats.accepted  # some rollbacks happened


TOP_K, TEMPERATURE, N_TOKENS = 2, 1.5, 4


def exact_law(target, prompt):
    """{(t1..t4): probability} under the target with the test's sampling settings."""
    return stats_helpers.exact_law(target, prompt, N_TOKENS, TEMPERATURE, TOP_K)


def test_speculative_sampling_with_the_assistant_keeps_the_target_distribution(tokenizer, pairs):
    target, assistant = pairs["e2b"]
    prompt = ids(tokenizer, PROMPTS[0])
    law = exact_law(target, prompt)
    outcomes = list(law)
    index = {o: i for i, o in enumerate(outcomes)}
    probs = torch.tensor([law[o] for o in outcomes])
    runner, drafter = ModelRunner(target), Gemma4AssistantDrafter(assistant, target)
    samples, drafted, accepted, trials = [], 0, 0, 1000
    for seed in range(trials):
        settings = DecodeSettings(mode="sample", temperature=TEMPERATURE, top_k=TOP_K, max_new_tokens=N_TOKENS, seed=seed, draft_length=2)
        for event in speculative_decode(runner, drafter, tokenizer, prompt, settings, set()):
            if isinstance(event, Finished):
                break
        assert event.reason == "max_new_tokens", event
        drafted += event.stats.drafted
        accepted += event.stats.accepted
        samples.append(index[tuple(event.token_ids)])
    assert drafted >= trials and 0 < accepted < drafted
    assert_same_distribution(torch.tensor(samples), probs)


MISFITS = [
    ("vocab_size", dict(vocab_size=416)),
    ("head_dim", dict(global_head_dim=16)),
    ("num_key_value_heads", dict(num_key_value_heads=1)),
    ("sliding_window", dict(sliding_window=16)),
    ("rope_parameters", dict(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
    })),
]


@pytest.mark.parametrize("field,overrides", MISFITS, ids=[m[0] for m in MISFITS])
def test_a_mismatched_assistant_is_refused_naming_the_field(pairs, field, overrides):
    target, _ = pairs["e2b"]
    config = assistant_config(target.config, **overrides)
    with pytest.raises(AssistantMismatch) as info:
        check_assistant_fits(target.config, config)
    assert info.value.field == field and field in str(info.value)
    assert isinstance(info.value, DrafterMismatch) and isinstance(info.value, ValueError)


def test_backbone_size_and_target_family_are_checked(tokenizer, pairs):
    target, assistant = pairs["e2b"]
    config = assistant_config(target.config)
    config.backbone_hidden_size = 96
    with pytest.raises(AssistantMismatch, match="backbone_hidden_size") as info:
        check_assistant_fits(target.config, config)
    assert info.value.field == "backbone_hidden_size"
    from engine.testing.tiny_models import build_model

    qwen = build_model(padded_vocab(len(tokenizer)))
    with pytest.raises(AssistantMismatch, match="Gemma 4") as info:
        Gemma4AssistantDrafter(assistant, qwen)
    assert info.value.field == "model_type"
    # The same assistant fits the other layout's target only if the shapes agree: they do not.
    with pytest.raises(AssistantMismatch):
        Gemma4AssistantDrafter(assistant, pairs["dense"][0])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """layout -> (target folder, assistant folder), written on first use."""
    from engine.testing.tiny_gemma4 import save_gemma4_pair

    root, made = tmp_path_factory.mktemp("gemma4"), {}

    def get(layout):
        if layout not in made:
            made[layout] = save_gemma4_pair(root, layout)
        return made[layout]

    return get


@pytest.fixture(scope="module")
def gemma4_folders(folders):
    return folders("e2b")


@pytest.mark.parametrize("layout", ["e2b", "dense"])
def test_session_detects_an_assistant_folder_and_drafts_with_it(folders, layout):
    from engine.session.session import Session

    target_dir, assistant_dir = folders(layout)
    session = Session.load(target_dir, assistant_dir, precision="fp32", device="cpu")
    expected = {"e2b": "Gemma4ForCausalLM", "dense": "Gemma4ForConditionalGeneration"}[layout]
    assert type(session.target.model).__name__ == expected
    assert session.drafter_model.tokenizer is None  # assistant repos ship no tokenizer
    drafter = session.drafter("model")
    assert isinstance(drafter, Gemma4AssistantDrafter)
    prompt = session.encode("def add(a, b):")
    settings = DecodeSettings(max_new_tokens=16, draft_length=3)
    plain, _ = run_to_end(session.plain(prompt, settings))
    spec, _ = run_to_end(session.speculative(prompt, settings, "model"))
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0


def test_session_refuses_a_mismatched_assistant_folder_before_loading_it(gemma4_folders, tmp_path):
    from engine.session.session import Session

    target_dir, _ = gemma4_folders
    wrong = build_gemma4_assistant(build_gemma4_target(416, "e2b"), sliding_window=16)
    wrong.save_pretrained(tmp_path / "wrong-assistant")
    with pytest.raises(DrafterMismatch, match="vocab_size"):
        Session.load(target_dir, tmp_path / "wrong-assistant", precision="fp32", device="cpu")


def test_cli_compare_runs_a_gemma4_target_with_its_assistant(gemma4_folders, capsys):
    from engine.cli import main

    target_dir, assistant_dir = gemma4_folders
    code = main(["compare", "def add(a, b):", "--target", str(target_dir), "--drafter-model", str(assistant_dir),
                 "--precision", "fp32", "--device", "cpu", "--max-new-tokens", "12", "--draft-length", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "outputs: identical" in out and assistant_dir.name in out
    assert "drafted / accepted" in out
