"""A cheaper drafter (reduced LM head, int8 weights) changes what is proposed, never the output."""
import copy

import pytest
import torch

from engine.core.events import Finished
from engine.core.settings import DecodeSettings
from engine.decode.decoding import eos_token_ids, plain_decode, speculative_decode
from engine.decode.divergence import explain_divergence
from engine.drafters import DraftModelDrafter
from engine.drafters.reduced_head import ReducedHead
from engine.models.runners.fast_linear import accelerate_linears
from engine.models.runners.runner import ModelRunner
from engine.quant.quantize import Int8Linear, to_int8_drafter
from engine.testing.tiny_models import build_model, build_tokenizer, perturbed_copy
from tests.engine.helpers import run_to_end

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n    print(i)"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def encode(tokenizer, text):
    return tokenizer(text)["input_ids"]


def int8_copy(model):
    return to_int8_drafter(copy.deepcopy(model))


def random_subset(vocab, size, seed):
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:size].tolist()


def decode_both(target, drafter, tokenizer, prompt, settings, eos=frozenset()):
    plain, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, settings, set(eos)))
    spec, steps = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, prompt, settings, set(eos)))
    assert isinstance(plain, Finished) and isinstance(spec, Finished), (plain, spec)
    return plain, spec, steps


@pytest.mark.parametrize("seed", range(3))
def test_greedy_output_is_identical_with_pruned_and_int8_drafters(tokenizer, seed):
    target = build_model(len(tokenizer), layers=3, seed=seed)
    base = perturbed_copy(target, [0.003, 0.01, 0.03][seed], seed=seed + 100)
    quantized = int8_copy(base)
    eos = eos_token_ids(target, tokenizer)
    vocab = len(tokenizer)
    drafters = {
        "pruned fp32": (base, ReducedHead(base.lm_head.weight, random_subset(vocab, vocab // 3, seed))),
        "pruned int8 rows": (base, ReducedHead(base.lm_head.weight, random_subset(vocab, 40, seed), int8=True)),
        "int8 model, full head": (quantized, None),
        "int8 model, pruned int8 head": (quantized, ReducedHead(quantized.lm_head.weight, random_subset(vocab, 100, seed), int8=True)),
    }
    for prompt_text in PROMPTS:
        prompt = encode(tokenizer, prompt_text)
        plain, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, DecodeSettings(max_new_tokens=24), eos))
        for k in (None, 2, 5):
            settings = DecodeSettings(max_new_tokens=24, draft_length=k)
            for name, (model, head) in drafters.items():
                spec, _ = run_to_end(speculative_decode(ModelRunner(target), DraftModelDrafter(model, head=head), tokenizer, prompt, settings, eos))
                assert isinstance(spec, Finished), spec
                assert spec.token_ids == plain.token_ids, (seed, prompt_text, k, name)
                assert spec.text == plain.text


def test_pruned_drafter_proposes_only_subset_and_request_tokens(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    prompt = encode(tokenizer, PROMPTS[0])
    subset = random_subset(len(tokenizer), 30, 1)
    head = ReducedHead(drafter.lm_head.weight, subset)
    proposer = DraftModelDrafter(drafter, head=head)
    proposed, context_tokens = set(), set()
    original = proposer.propose

    def spy(context, k, sampler):
        context_tokens.update(context)
        draft = original(context, k, sampler)
        proposed.update(draft.tokens)
        assert set(draft.tokens) <= set(subset) | set(context)
        return draft

    proposer.propose = spy
    plain, spec, _ = decode_both(target, proposer, tokenizer, prompt, DecodeSettings(max_new_tokens=40, draft_length=4))
    assert spec.token_ids == plain.token_ids
    assert proposed, "the drafter proposed nothing"
    # The target wrote tokens outside the base subset, and they became proposable.
    assert set(spec.token_ids) - set(subset)
    assert set(head.ids.tolist()) == set(subset) | context_tokens


def test_reduced_head_logits_are_the_models_at_the_kept_ids(tiny_pair):
    tokenizer, _, drafter = tiny_pair
    ids = list(range(0, len(tokenizer), 7))
    head = ReducedHead(drafter.lm_head.weight, ids)
    runner = ModelRunner(drafter)
    prompt = encode(tokenizer, PROMPTS[1])
    full = runner.forward(prompt)[-1]
    runner.reset()
    hidden = runner.forward_hidden(prompt)[-1]
    assert torch.allclose(head.logits(hidden), full[ids], rtol=1e-4, atol=1e-4)
    head.include([1, 2, 3, 7])
    assert head.ids.tolist() == ids + [1, 2, 3]
    assert torch.allclose(head.logits(hidden), full[head.ids], rtol=1e-4, atol=1e-4)
    head.reset()
    assert head.ids.tolist() == ids


def test_reduced_head_rejects_ids_outside_the_vocabulary(tiny_pair):
    _, _, drafter = tiny_pair
    with pytest.raises(ValueError, match="outside"):
        ReducedHead(drafter.lm_head.weight, [0, drafter.lm_head.weight.shape[0]])


def test_int8_drafter_stays_close_to_the_float_one(tiny_pair):
    tokenizer, _, drafter = tiny_pair
    quantized = int8_copy(drafter)
    linears = [m for m in quantized.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == [quantized.lm_head]  # every other linear layer is int8 now
    assert any(isinstance(m, Int8Linear) for m in quantized.modules())
    prompt = encode(tokenizer, PROMPTS[2])
    want = ModelRunner(drafter).forward(prompt, n_logits=len(prompt))
    got = ModelRunner(quantized).forward(prompt, n_logits=len(prompt))
    assert got.dtype == torch.float32
    # Random wide-init weights amplify rounding through the layers; trained weights do far better.
    rel = (got - want).norm() / want.norm()
    assert rel < 0.15, rel
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean()
    assert agree > 0.8, agree


def test_bf16_target_with_int8_pruned_drafter_matches_plain_or_splits_at_a_near_tie(tokenizer):
    target = build_model(len(tokenizer), layers=3, seed=11)
    drafter = int8_copy(perturbed_copy(target, 0.01, seed=5).to(torch.bfloat16))
    target.to(torch.bfloat16)
    accelerate_linears(target)  # batch-invariant linears where the fast kernel exists
    head = ReducedHead(drafter.lm_head.weight, random_subset(len(tokenizer), 120, 2), int8=True)
    for prompt_text in PROMPTS:
        prompt = encode(tokenizer, prompt_text)
        plain, spec, _ = decode_both(target, DraftModelDrafter(drafter, head=head), tokenizer, prompt, DecodeSettings(max_new_tokens=30))
        if spec.token_ids != plain.token_ids:
            d = explain_divergence(target, prompt, list(plain.token_ids), list(spec.token_ids))
            assert d.top2_gap < 0.1, d  # only a bf16 rounding near-tie may split them


def test_drafter_reuses_the_prompt_prefix_it_already_holds(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    proposer = DraftModelDrafter(drafter, head=ReducedHead(drafter.lm_head.weight, None))
    fed = []
    original = proposer.runner.forward_hidden
    proposer.runner.forward_hidden = lambda tokens, n_last=1: fed.append(list(tokens)) or original(tokens, n_last)
    shared = encode(tokenizer, "The quick brown fox jumps over")
    settings = DecodeSettings(max_new_tokens=12, draft_length=3)
    outputs = []
    for tail in (" the lazy dog.", " a sleeping cat."):
        prompt = shared + encode(tokenizer, tail)
        fed.clear()
        plain, spec, _ = decode_both(target, proposer, tokenizer, prompt, settings)
        assert spec.token_ids == plain.token_ids
        outputs.append(fed[0])
    # The drafter is prepared with prompt + the target's first token and prefills all but that.
    assert outputs[0] == shared + encode(tokenizer, " the lazy dog.")  # a full prefill first
    assert outputs[1] == encode(tokenizer, " a sleeping cat.")  # then only what differs


def test_fused_runner_matches_transformers_on_an_int8_drafter(tiny_pair):
    from engine.models.runners.fused_runner import FusedRunner, unsupported_reason

    tokenizer, _, drafter = tiny_pair
    quantized = int8_copy(drafter)
    assert unsupported_reason(quantized) is None
    assert unsupported_reason(drafter) == "linear layers are not int8 / int4"
    prompt = encode(tokenizer, PROMPTS[2])
    hf = ModelRunner(quantized)
    fused = FusedRunner(quantized, initial_capacity=4)  # grows while feeding
    want = hf.forward_hidden(prompt, n_last=len(prompt))
    got = torch.cat([fused.forward_hidden(prompt[:5], n_last=5), fused.forward_hidden(prompt[5:], n_last=len(prompt) - 5)])
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    # Rolling back and feeding something else matches a fresh run of that sequence.
    fused.crop(3)
    hf.crop(3)
    assert fused.length == 3
    assert torch.allclose(fused.forward([7, 8]), hf.forward([7, 8]), rtol=1e-4, atol=1e-4)


def test_a_fused_drafter_caches_in_fp16_close_to_its_fp32_cache(tiny_pair):
    """A drafter's FusedRunner keeps its keys and values in fp16 (half the memory as its cache
    grows with a conversation); its states stay within fp16's rounding of the fp32 cache's."""
    from engine.models.runners.fused_runner import FusedRunner

    tokenizer, _, drafter = tiny_pair
    quantized = int8_copy(drafter)
    proposer = DraftModelDrafter(quantized, fused=True)
    assert isinstance(proposer.runner, FusedRunner) and proposer.runner.kv.k.dtype == torch.float16
    prompt = encode(tokenizer, PROMPTS[2] * 3)
    half = proposer.runner.forward_hidden(prompt, n_last=len(prompt))
    full = FusedRunner(quantized).forward_hidden(prompt, n_last=len(prompt))
    assert FusedRunner(quantized).kv.k.dtype == torch.float32  # a target's cache stays fp32
    rel = float((half - full).norm() / full.norm())
    assert 0 < rel < 5e-3, rel


def test_greedy_output_is_identical_with_the_fused_int8_drafter(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    quantized = int8_copy(drafter)
    head = ReducedHead(quantized.lm_head.weight, random_subset(len(tokenizer), 150, 3), int8=True)
    proposer = DraftModelDrafter(quantized, head=head, fused=True)
    for prompt_text in PROMPTS:
        for k in (None, 3):
            plain, spec, _ = decode_both(target, proposer, tokenizer, encode(tokenizer, prompt_text), DecodeSettings(max_new_tokens=30, draft_length=k))
            assert spec.token_ids == plain.token_ids
            if k:
                assert spec.stats.accepted > 0


def test_an_int8_drafter_holds_packed_weights_that_compute_the_same(tiny_pair):
    import copy

    from kernels import quant_linear
    from kernels.linear.packing import unpack

    if quant_linear.fast_backend() is None:
        pytest.skip("weights are packed only for the compiled int8 kernel")
    tokenizer, _, drafter = tiny_pair
    packed = int8_copy(drafter)
    int8_layers = [m for m in packed.modules() if isinstance(m, Int8Linear)]
    assert int8_layers and all(m.q.dim() == 3 for m in int8_layers)
    rows = copy.deepcopy(packed)
    for m in rows.modules():
        if isinstance(m, Int8Linear):
            m.q = unpack(m.q).contiguous()
    prompt = encode(tokenizer, PROMPTS[1])
    got = ModelRunner(packed).forward(prompt, n_logits=len(prompt))
    want = ModelRunner(rows).forward(prompt, n_logits=len(prompt))
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_fused_runner_matches_transformers_on_an_int4_drafter(tiny_pair):
    from engine.models.runners.fused_runner import FusedRunner, unsupported_reason
    from engine.quant.quantize import Int4Linear, to_int4_drafter

    tokenizer, _, drafter = tiny_pair
    quantized = to_int4_drafter(copy.deepcopy(drafter))
    assert unsupported_reason(quantized) is None
    assert any(isinstance(m, Int4Linear) for m in quantized.modules())
    assert isinstance(quantized.lm_head, torch.nn.Linear)  # left for the reduced head
    prompt = encode(tokenizer, PROMPTS[2])
    hf = ModelRunner(quantized)
    fused = FusedRunner(quantized, initial_capacity=4)
    want = hf.forward_hidden(prompt, n_last=len(prompt))
    got = torch.cat([fused.forward_hidden(prompt[:5], n_last=5), fused.forward_hidden(prompt[5:], n_last=len(prompt) - 5)])
    # Each int4 layer rounds its inputs to int8, where a last-bit difference (attention's
    # summation order: transformers' SDPA vs the kernel) can land on the other side of a step,
    # and this random 4-layer net amplifies such steps: close, not bit-equal. How close depends
    # on the tiles' fp32 order (0.04-0.055 measured on two of them); a wrong context is off by far
    # more (every position one too far: 0.6).
    rel = float((got - want).norm() / want.norm())
    assert rel < 0.1, rel


def test_greedy_output_is_identical_with_the_fused_int4_drafter(tiny_pair):
    from engine.quant.quantize import to_int4_drafter

    tokenizer, target, drafter = tiny_pair
    quantized = to_int4_drafter(copy.deepcopy(drafter))
    head = ReducedHead(quantized.lm_head.weight, random_subset(len(tokenizer), 150, 3), int8=True)
    proposer = DraftModelDrafter(quantized, head=head, fused=True)
    accepted = 0
    for prompt_text in PROMPTS:
        for k in (None, 3):
            plain, spec, _ = decode_both(target, proposer, tokenizer, encode(tokenizer, prompt_text), DecodeSettings(max_new_tokens=30, draft_length=k))
            assert spec.token_ids == plain.token_ids
            accepted += spec.stats.accepted
    assert accepted > 0


def test_catching_up_is_timed_apart_from_drafting(tiny_pair):
    """After speculation was off the drafter first feeds every token it missed; the draft-length
    controller must price drafting per token without that one-off catch-up."""
    from engine.core.sampler import Sampler

    tokenizer, _, drafter = tiny_pair
    proposer = DraftModelDrafter(drafter)
    # Hundreds of tokens to catch up on: on a model this small a step is mostly fixed overhead,
    # and a catch-up of ~20 tokens measured no dearer than a normal step about one run in three.
    context = (encode(tokenizer, PROMPTS[2] + " " + PROMPTS[0] + " " + PROMPTS[1]) * 40)[:480]
    proposer.prepare(context[:8])
    sampler = Sampler(DecodeSettings())
    for n in range(8, 12):  # normal steps: one new token each
        proposer.propose(context[:n], 2, sampler)
        proposer.observe(n)
        assert proposer.catch_up_s == 0.0
    import time

    start = time.perf_counter()
    proposer.propose(context, 2, sampler)  # len(context) - 11 tokens to catch up on first
    total = time.perf_counter() - start
    assert len(context) - 11 > 2
    assert 0.0 < proposer.catch_up_s < total
