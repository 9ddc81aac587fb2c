"""An int8 target (precision "int8"): the one lossy step is the quantization; speculation on top
of it is lossless with respect to that same int8 target, and its weights are converted once."""
import copy

import pytest
import torch

from engine.core.events import Finished
from engine.core.settings import DecodeSettings
from engine.models.loading.loader import load_model
from engine.models.runners.runner import ModelRunner
from engine.quant import weight_cache
from engine.quant.quantize import Int8Linear, to_int8_drafter, to_int8_target
from engine.session.session import Session
from engine.testing.tiny_models import save_pair
from tests.engine.helpers import assert_speculation_matches_plain, run_to_end

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n    print(i)"]


@pytest.fixture(scope="module")
def int8_pair(tiny_pair):
    tokenizer, target, drafter = tiny_pair
    quantized = copy.deepcopy(target)
    to_int8_target(quantized)
    return tokenizer, quantized, drafter


def test_every_linear_layer_and_the_head_are_int8(int8_pair, tiny_pair):
    _, quantized, _ = int8_pair
    assert isinstance(quantized.lm_head, Int8Linear)
    assert not any(isinstance(m, torch.nn.Linear) for m in quantized.modules())
    assert quantized.get_input_embeddings().weight.dtype == tiny_pair[1].get_input_embeddings().weight.dtype


def test_int8_target_stays_close_to_the_float_one(int8_pair, tiny_pair):
    tokenizer, quantized, _ = int8_pair
    ids = tokenizer("def add(a, b):\n    return a + b")["input_ids"]
    want = ModelRunner(tiny_pair[1]).forward(ids, n_logits=len(ids))
    got = ModelRunner(quantized).forward(ids, n_logits=len(ids))
    assert got.dtype == torch.float32
    assert not torch.equal(got, want)  # it is lossy ...
    # ... by a little (this random 4-layer model with a wide init is harsher on int8 than a
    # trained one): a relative logit error under 10%, and mostly the same top token.
    assert (got - want).norm() / want.norm() < 0.1
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.8


@pytest.mark.parametrize("int8_drafter", [False, True])
def test_greedy_speculation_on_the_int8_target_equals_its_plain_decoding(int8_pair, int8_drafter):
    tokenizer, target, drafter = int8_pair
    if int8_drafter:
        drafter = to_int8_drafter(copy.deepcopy(drafter))
    accepted = assert_speculation_matches_plain(target, drafter, tokenizer, PROMPTS)
    assert accepted > 0  # the drafter did propose tokens that were verified in blocks


def test_int8_load_converts_once_then_reads_the_cache(tmp_path):
    target_dir, drafter_dir = save_pair(tmp_path)
    first = load_model(target_dir, "int8", "cpu")
    assert first.weights == "int8" and not first.from_cache
    path = weight_cache.cache_path(target_dir)
    assert path.exists()
    stamp = path.stat().st_mtime_ns
    second = load_model(target_dir, "int8", "cpu")
    assert second.from_cache and path.stat().st_mtime_ns == stamp
    for name, layer in first.model.named_modules():
        if isinstance(layer, Int8Linear):
            other = second.model.get_submodule(name)
            assert torch.equal(layer.q, other.q) and torch.equal(layer.scale, other.scale), name
    ids = first.tokenizer("for i in range(3):")["input_ids"]
    assert torch.equal(ModelRunner(first.model).forward(ids), ModelRunner(second.model).forward(ids))


def test_a_cache_that_does_not_match_the_model_is_converted_again(tmp_path):
    target_dir, _ = save_pair(tmp_path)
    weight_cache.save(target_dir, {"lm_head.q": torch.zeros(3, 3, dtype=torch.int8), "lm_head.scale": torch.ones(3)})
    loaded = load_model(target_dir, "int8", "cpu")
    assert not loaded.from_cache
    assert weight_cache.load(target_dir)["lm_head.q"].shape == loaded.model.lm_head.q.shape


def test_session_in_int8_precision(tmp_path):
    target_dir, drafter_dir = save_pair(tmp_path)
    session = Session.load(target_dir, drafter_dir, "int8", "cpu")
    assert session.precision == "int8" and session.target.weights == "int8"
    prompt = session.encode("def add(a, b):")
    settings = DecodeSettings(max_new_tokens=24)
    plain, _ = run_to_end(session.plain(prompt, settings))
    spec, _ = run_to_end(session.speculative(prompt, settings))
    assert isinstance(spec, Finished) and spec.token_ids == plain.token_ids
    # The auto drafter next to a quantized target is int4 where the int4 kernel runs.
    from engine.quant.quantize import int4_available
    assert session.drafter_model.weights == ("int4" if int4_available() else "int8")


def test_a_warm_up_leaves_no_costs_to_seed_the_first_request(tmp_path):
    from engine.session.compare import warm_up

    target_dir, drafter_dir = save_pair(tmp_path)
    session = Session.load(target_dir, drafter_dir, "int8", "cpu")
    warm_up(session)
    assert session._costs == {}  # its figures hold one-time costs
    run_to_end(session.speculative(session.encode("def add(a, b):"), DecodeSettings(max_new_tokens=16)))
    assert session._costs["model"]["measured"] is not None
