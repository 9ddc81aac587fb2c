"""An int4 target (precision "int4"): 4-bit weights and int8-quantized layer inputs, the one
lossy step; speculation on top of it is lossless with respect to that same int4 target, and its
weights are converted once, then read from the cache."""
import copy

import pytest
import torch

from engine.core.events import Finished
from engine.core.settings import DecodeSettings
from engine.models.loading.loader import load_model
from engine.models.runners.invariant_attention import use_batch_invariant_attention
from engine.models.runners.runner import ModelRunner
from engine.quant import weight_cache
from engine.quant.quantize import Int4Linear, Int8Linear, to_int4_target, to_int8_drafter
from engine.session.session import Session
from engine.testing.tiny_models import save_pair
from kernels.int4_linear.reference import dequantize, supports
from kernels.quant_linear.reference import dequantize as dequantize_int8
from tests.engine.helpers import assert_speculation_matches_plain, run_to_end

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n    print(i)"]


@pytest.fixture(scope="module")
def int4_pair(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    quantized = copy.deepcopy(target)
    to_int4_target(quantized)
    # As load_model does for every CPU target. int4 needs it: a layer rounds its inputs to int8,
    # so a last-bit difference from SDPA (whose sums depend on the row count) can move an input
    # across a rounding boundary, which plain fp32 would have absorbed.
    assert use_batch_invariant_attention(quantized)
    return tokenizer, quantized, drafter


def test_every_linear_layer_is_int4_where_its_shape_allows(int4_pair, tiny_pair):
    _, quantized, _ = int4_pair
    assert not any(isinstance(m, torch.nn.Linear) for m in quantized.modules())
    layers = [m for m in quantized.modules() if isinstance(m, (Int4Linear, Int8Linear))]
    assert layers and all(isinstance(m, Int4Linear) == supports(m.out_features, m.in_features) for m in layers)
    assert any(isinstance(m, Int4Linear) for m in layers)
    # The tiny vocabulary (387 rows) is not a multiple of 4: its head stays int8, and still runs.
    assert isinstance(quantized.lm_head, Int4Linear if supports(*tiny_pair[1].lm_head.weight.shape) else Int8Linear)


def test_int4_target_computes_its_dequantized_weights(int4_pair, tiny_pair):
    """The model runs on exactly the weights its codes stand for; what remains is the rounding
    of each layer's inputs to int8. (Against the float model this random 4-layer net, with its
    wide init, amplifies 4-bit weight rounding to ~50% logit error: measured 0.49 with the
    dequantized weights in plain fp32, so that is the weights, not the kernel.)"""
    tokenizer, quantized, _ = int4_pair
    ids = tokenizer("def add(a, b):\n    return a + b")["input_ids"]
    dequantized = copy.deepcopy(tiny_pair[1])
    for name, layer in quantized.named_modules():
        if isinstance(layer, Int4Linear):
            dequantized.get_submodule(name).weight.data = dequantize(layer.packed, layer.scale, layer.offset)
        elif isinstance(layer, Int8Linear):
            dequantized.get_submodule(name).weight.data = dequantize_int8(layer.q, layer.scale)
    want = ModelRunner(dequantized).forward(ids, n_logits=len(ids))
    got = ModelRunner(quantized).forward(ids, n_logits=len(ids))
    assert got.dtype == torch.float32 and not torch.equal(got, want)
    assert (got - want).norm() / want.norm() < 0.2  # measured 0.14


@pytest.mark.parametrize("int8_drafter", [False, True])
def test_greedy_speculation_on_the_int4_target_equals_its_plain_decoding(int4_pair, int8_drafter):
    tokenizer, target, drafter = int4_pair
    if int8_drafter:
        drafter = to_int8_drafter(copy.deepcopy(drafter))
    accepted = assert_speculation_matches_plain(target, drafter, tokenizer, PROMPTS)
    assert accepted > 0


def test_int4_load_converts_once_then_reads_the_cache(tmp_path):
    target_dir, _ = save_pair(tmp_path)
    first = load_model(target_dir, "int4", "cpu")
    assert first.weights == "int4" and not first.from_cache
    path = weight_cache.cache_path(target_dir, "int4")
    assert path.exists() and path.parent.name == "int4"
    assert not weight_cache.cache_path(target_dir, "int8").exists()  # the kinds do not mix
    stamp = path.stat().st_mtime_ns
    second = load_model(target_dir, "int4", "cpu")
    assert second.from_cache and path.stat().st_mtime_ns == stamp
    for name, layer in first.model.named_modules():
        if isinstance(layer, Int4Linear):
            other = second.model.get_submodule(name)
            assert torch.equal(layer.packed, other.packed) and torch.equal(layer.scale, other.scale), name
    ids = first.tokenizer("for i in range(3):")["input_ids"]
    assert torch.equal(ModelRunner(first.model).forward(ids), ModelRunner(second.model).forward(ids))


def test_converting_again_removes_the_cache_of_an_earlier_format(tmp_path):
    """int4 v2 stores fp16 scales; the v1 file (fp32 scales) of the same model is never read
    again, so writing v2 drops it."""
    target_dir, _ = save_pair(tmp_path)
    path = weight_cache.cache_path(target_dir, "int4")
    assert path.name.endswith(f"-v{weight_cache.VERSIONS['int4']}.safetensors")
    older = path.with_name(path.name.rsplit("-v", 1)[0] + "-v1.safetensors")
    other_model = path.with_name("another-model-0123456789ab-v1.safetensors")
    for stale in (older, other_model):
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_bytes(b"old")
    loaded = load_model(target_dir, "int4", "cpu")
    assert not loaded.from_cache and path.exists()
    assert not older.exists() and other_model.exists()  # another model's file is left alone
    scales = [m.scale for m in loaded.model.modules() if isinstance(m, Int4Linear)]
    assert scales and all(s.dtype == torch.float16 for s in scales)


def test_an_int8_cache_is_not_taken_for_an_int4_one(tmp_path):
    target_dir, _ = save_pair(tmp_path)
    load_model(target_dir, "int8", "cpu")
    weight_cache.save(target_dir, weight_cache.load(target_dir, "int8"), "int4")  # int8 tensors under the int4 name
    loaded = load_model(target_dir, "int4", "cpu")
    assert not loaded.from_cache
    assert any(isinstance(m, Int4Linear) for m in loaded.model.modules())


def test_session_in_int4_precision(tmp_path):
    target_dir, drafter_dir = save_pair(tmp_path)
    session = Session.load(target_dir, drafter_dir, "int4", "cpu")
    assert session.precision == "int4" and session.target.weights == "int4"
    prompt = session.encode("def add(a, b):")
    settings = DecodeSettings(max_new_tokens=24)
    plain, _ = run_to_end(session.plain(prompt, settings))
    spec, _ = run_to_end(session.speculative(prompt, settings))
    assert isinstance(spec, Finished) and spec.token_ids == plain.token_ids
    # Whatever costs it measured seed the next request, which stays identical too.
    assert "model" in session._costs
    again, _ = run_to_end(session.speculative(prompt, settings))
    assert again.token_ids == plain.token_ids


@pytest.mark.parametrize("to_target", ["int4", "int8"])
def test_fused_target_rows_are_bit_identical_to_one_at_a_time(tiny_pair, to_target):
    """A quantized target runs one fused kernel call per layer (Session.target_runner): a
    verification pass over k+1 tokens must give the logits of k+1 one-token steps, bit for bit."""
    from engine.models.runners.fused_runner import FusedRunner
    from engine.quant.quantize import to_int8_target

    tokenizer, target, _ = tiny_pair
    model = copy.deepcopy(target)
    (to_int4_target if to_target == "int4" else to_int8_target)(model)
    ids = tokenizer("def add(a, b):\n    return a + b  # and more")["input_ids"]
    together, alone = FusedRunner(model), FusedRunner(model)
    together.forward(ids[:4])
    alone.forward(ids[:4])
    many = together.forward(ids[4:12], n_logits=8)
    one = torch.cat([alone.forward([t]) for t in ids[4:12]])
    assert torch.equal(many, one)


def test_a_quantized_session_runs_its_target_fused(tmp_path):
    from engine.models.runners.fused_runner import FusedRunner
    from kernels import draft_decoder

    target_dir, drafter_dir = save_pair(tmp_path)
    session = Session.load(target_dir, drafter_dir, "int4", "cpu")
    fused = draft_decoder.fast_backend() is not None
    assert isinstance(session.target_runner(), FusedRunner) == fused
    assert isinstance(session.target_runner(session.model_drafter), FusedRunner) == fused
    assert isinstance(Session.load(target_dir, drafter_dir, "bf16", "cpu").target_runner(), ModelRunner)
