"""In-checkpoint MTP layers as a drafter (transformers' MtpModel on a tiny GLM-4.5-style MoE
whose checkpoint stores one MTP layer as DeepSeek-V3 / GLM-4.x do), and the prompt-lookup
fallback, said out loud, for models without one."""
import pytest
import torch

from engine.core.events import Finished
from engine.core.sampler import Sampler
from engine.core.settings import DecodeSettings
from engine.decode.decoding import plain_decode, speculative_decode
from engine.drafters import MtpLayersDrafter, PromptLookupDrafter
from engine.drafters.mtp_layers import _mtp_patterns, inspect_mtp, load_mtp_layers
from engine.models.loading.loader import load_model
from engine.models.runners.runner import ModelRunner
from engine.testing.tiny_models import build_tokenizer
from engine.testing.tiny_mtp import save_tiny_mtp_model
from tests.engine.helpers import run_to_end
from tests.stats_helpers import assert_same_distribution, exact_law

PROMPTS = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog."]
NEW = 24


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only adds contention
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def mtp_folder(tmp_path_factory, tokenizer):
    return save_tiny_mtp_model(tmp_path_factory.mktemp("glm-mtp") / "tiny-glm-mtp", tokenizer)


@pytest.fixture(scope="module")
def loaded(mtp_folder):
    """(target, mtp layers) in float32."""
    target = load_model(mtp_folder, "fp32", "cpu").model
    return target, load_mtp_layers(target)


def ids(tokenizer, text):
    return tokenizer(text)["input_ids"]


def plain_ids(target, tokenizer, prompt, new=NEW):
    result, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, DecodeSettings(max_new_tokens=new), set()))
    assert isinstance(result, Finished), result
    return result.token_ids


def transformers_mtp_greedy(target, prompt, new):
    """transformers' generate(use_mtp=True): the oracle. Its MTP loader looks for the layer
    numbers of the real GLM checkpoints (46, 92); point it at the tiny one's as ours does."""
    target._keys_to_ignore_on_load_unexpected = _mtp_patterns(target)
    try:
        with torch.inference_mode():
            out = target.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, use_mtp=True, eos_token_id=None)
    finally:
        del target._keys_to_ignore_on_load_unexpected
    return tuple(out[0, len(prompt):].tolist())


def test_the_checkpoint_mtp_layer_is_found_and_loaded(loaded, mtp_folder):
    from safetensors.torch import load_file

    target, mtp = loaded
    support = inspect_mtp(target)
    assert support.usable and support.layers == 1
    stored = load_file(mtp_folder / "model.safetensors")
    torch.testing.assert_close(mtp.layers[0].eh_proj.weight, stored["model.layers.2.eh_proj.weight"])
    torch.testing.assert_close(mtp.layers[0].mtp_block.self_attn.o_proj.weight, stored["model.layers.2.self_attn.o_proj.weight"])
    assert mtp.shared_head is target.lm_head  # the MTP layer predicts with the target's own head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_greedy_matches_plain_and_transformers_use_mtp(tokenizer, loaded, mtp_folder, dtype):
    target, mtp = loaded
    if dtype != torch.float32:  # loaded as bf16, so that transformers' own MTP loader agrees
        target = load_model(mtp_folder, "bf16", "cpu", fast_kernels=False).model
        assert target.dtype == dtype
        mtp = load_mtp_layers(target)
    for text in PROMPTS:
        prompt = ids(tokenizer, text)
        reference = plain_ids(target, tokenizer, prompt)
        assert transformers_mtp_greedy(target, prompt, NEW) == reference
        for k in (1, 2, 4, None):
            result, _ = run_to_end(speculative_decode(
                ModelRunner(target), MtpLayersDrafter(mtp), tokenizer, prompt, DecodeSettings(max_new_tokens=NEW, draft_length=k), set()))
            assert isinstance(result, Finished), result
            assert result.token_ids == reference, (text, k)


def test_acceptance_is_partial_and_reported(tokenizer, loaded):
    target, mtp = loaded
    settings = DecodeSettings(max_new_tokens=40, draft_length=3)
    result, steps = run_to_end(speculative_decode(ModelRunner(target), MtpLayersDrafter(mtp), tokenizer, ids(tokenizer, PROMPTS[0]), settings, set()))
    s = result.stats
    assert 0 < s.accepted < s.drafted
    assert len(s.acceptance_by_position) == 3 and s.acceptance_by_position[0] > 0
    assert sum(sum(st.from_draft) for st in steps) == s.accepted


def test_first_draft_matches_transformers_candidate_generator(tokenizer, loaded):
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import MTPCandidateGenerator

    target, mtp = loaded
    prompt = ids(tokenizer, PROMPTS[0])
    with torch.inference_mode():
        out = target(input_ids=torch.tensor([prompt]), output_hidden_states=True)
    first = int(out.logits[0, -1].argmax())
    target._keys_to_ignore_on_load_unexpected = _mtp_patterns(target)
    try:
        oracle = MTPCandidateGenerator(target, GenerationConfig(max_length=100), model_kwargs={})
    finally:
        del target._keys_to_ignore_on_load_unexpected
    n = len(prompt) + 1
    with torch.inference_mode():
        cand, cand_logits = oracle.get_candidates(
            torch.tensor([prompt + [first]]), model_kwargs={"position_ids": torch.arange(n).unsqueeze(0)},
            model_outputs=out, is_first_iteration=False, n_last_matches=0,
        )
    runner = ModelRunner(target)
    drafter = MtpLayersDrafter(mtp)
    drafter.attach_target(runner)
    runner.forward(prompt)
    drafter.prepare(prompt + [first])
    q = drafter.propose(prompt + [first], 1, Sampler(DecodeSettings(mode="sample", temperature=1.0))).probs[0]
    torch.testing.assert_close(q, cand_logits[0, 0].float().softmax(-1), atol=1e-5, rtol=1e-4)
    drafter.reset()
    drafter.prepare(prompt + [first])
    assert drafter.propose(prompt + [first], 1, Sampler(DecodeSettings())).tokens == (int(cand[0, -1]),)


class RecheckedMtp(MtpLayersDrafter):
    """Every proposal must equal that of a fresh drafter fed a fresh prefill of the accepted
    context: the MTP cache and kept hidden states follow acceptances and rollbacks exactly."""

    checks = 0

    def propose(self, context, k, sampler):
        fresh_runner = ModelRunner(self.target.model)
        fresh = MtpLayersDrafter(self.mtp)
        fresh.attach_target(fresh_runner)
        fresh_runner.forward(context[:-1])
        fresh.prepare(context)
        expected = fresh.propose(context, k, sampler)
        draft = super().propose(context, k, sampler)
        assert draft.tokens == expected.tokens, (len(context), draft.tokens, expected.tokens)
        self.checks += 1
        return draft


def test_drafts_follow_the_accepted_context_only(tokenizer, loaded):
    target, mtp = loaded
    drafter = RecheckedMtp(mtp)
    settings = DecodeSettings(max_new_tokens=30, draft_length=3)
    result, _ = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, ids(tokenizer, PROMPTS[1]), settings, set()))
    assert drafter.checks >= 8 and 0 < result.stats.accepted < result.stats.drafted


def test_speculative_sampling_with_mtp_keeps_the_target_distribution(tokenizer, loaded):
    top_k, temperature, n_tokens = 2, 1.5, 4
    target, mtp = loaded
    prompt = ids(tokenizer, PROMPTS[0])
    law = exact_law(target, prompt, n_tokens, temperature, top_k)
    index = {o: i for i, o in enumerate(law)}
    runner, drafter = ModelRunner(target), MtpLayersDrafter(mtp)
    samples, drafted, accepted, trials = [], 0, 0, 1000
    for seed in range(trials):
        settings = DecodeSettings(mode="sample", temperature=temperature, top_k=top_k, max_new_tokens=n_tokens, seed=seed, draft_length=2)
        result, _ = run_to_end(speculative_decode(runner, drafter, tokenizer, prompt, settings, set()))
        drafted += result.stats.drafted
        accepted += result.stats.accepted
        samples.append(index[result.token_ids])
    assert drafted >= trials and 0 < accepted < drafted
    assert_same_distribution(torch.tensor(samples), torch.tensor(list(law.values())))


def test_models_without_usable_mtp_layers_say_so(tokenizer, tiny_pair, tmp_path):
    _, qwen, _ = tiny_pair
    support = inspect_mtp(qwen)
    assert not support.usable and "no MTP layers" in support.reason
    pruned = save_tiny_mtp_model(tmp_path / "pruned", tokenizer, with_mtp=False)
    support = inspect_mtp(load_model(pruned, "fp32", "cpu").model)
    assert not support.usable and "no MTP weights" in support.reason


def test_session_uses_mtp_layers_or_falls_back_to_prompt_lookup_with_a_note(tokenizer, mtp_folder, tmp_path):
    from engine.session.session import Session

    session = Session.load(mtp_folder, precision="fp32", device="cpu")
    assert isinstance(session.drafter("mtp"), MtpLayersDrafter) and session.drafter_note is None
    prompt = session.encode("def add(a, b):")
    settings = DecodeSettings(max_new_tokens=16, draft_length=2)
    plain, _ = run_to_end(session.plain(prompt, settings))
    spec, _ = run_to_end(session.speculative(prompt, settings, "mtp"))
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0

    pruned = Session.load(save_tiny_mtp_model(tmp_path / "pruned", tokenizer, with_mtp=False), precision="fp32", device="cpu")
    assert isinstance(pruned.drafter("mtp"), PromptLookupDrafter)
    assert "has no usable MTP drafter here" in pruned.drafter_note and "using prompt lookup" in pruned.drafter_note


def test_cli_compare_with_mtp_layers_and_the_fallback_note(tokenizer, mtp_folder, tmp_path, capsys):
    from engine.cli import main

    common = ["--precision", "fp32", "--device", "cpu", "--max-new-tokens", "10", "--drafter", "mtp", "--draft-length", "2"]
    assert main(["compare", "def add(a, b):", "--target", str(mtp_folder), *common]) == 0
    captured = capsys.readouterr()
    assert "speculative (MTP layers" in captured.out and "outputs: identical" in captured.out
    pruned = save_tiny_mtp_model(tmp_path / "pruned", tokenizer, with_mtp=False)
    assert main(["compare", "def add(a, b):", "--target", str(pruned), *common]) == 0
    captured = capsys.readouterr()
    assert "has no usable MTP drafter here" in captured.err and "using prompt lookup" in captured.err
    assert "speculative (prompt lookup" in captured.out
