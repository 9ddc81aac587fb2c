"""A draft model's int8 / int4 layers go through the weight cache as a target's do: the first
load quantizes and writes them, later loads read the verified file instead of quantizing
again, and a damaged file is removed and rebuilt. A drafter's file (no LM head) and a
target's (with it) are kept apart, so a folder used in both roles never rewrites either."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from engine.models.loading.loader import load_model
from engine.models.runners.runner import ModelRunner
from engine.quant import weight_cache
from engine.quant.quantize import DamagedWeights, Int4Linear, Int8Linear
from engine.testing.tiny_models import save_pair
from tests.engine.models.loading.test_cache_integrity import first_scale, write_nan

KINDS = ["int8", "int4"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def load_drafter(folder: Path, kind: str):
    return load_model(folder, "bf16", "cpu", role="drafter", weights=kind)


def drafter_logits(loaded, text: str = "def add(a, b):") -> torch.Tensor:
    ids = loaded.tokenizer(text)["input_ids"]
    return ModelRunner(loaded.model).forward(ids, n_logits=len(ids))


def poison_weights_keeping_the_stamp(folder: Path, tensor: str) -> None:
    """Write NaN into a linear weight of the checkpoint and put its size and mtime back: the
    cache key still matches, so only a load that quantizes again reads the poisoned values
    (and refuses them); a load from the cache never reads them."""
    weights = folder / "model.safetensors"
    stat = weights.stat()
    write_nan(weights, tensor)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_size == stat.st_size


@pytest.mark.parametrize("kind", KINDS)
def test_a_drafter_with_a_valid_cache_is_not_quantized_again(tmp_path, kind):
    _, drafter = save_pair(tmp_path)
    first = load_drafter(drafter, kind)
    path = weight_cache.cache_path(drafter, kind, "drafter")
    assert not first.from_cache and path.exists()
    assert not weight_cache.cache_path(drafter, kind).exists()  # the target's file is another one
    cached = weight_cache.load(drafter, kind, role="drafter")
    assert not any(name.startswith("lm_head.") for name in cached)  # the reduced head quantizes its own rows
    poison_weights_keeping_the_stamp(drafter, "model.layers.0.mlp.up_proj.weight")
    other = "int8" if kind == "int4" else "int4"  # no cache yet: quantizes the poisoned weights now
    with pytest.raises(DamagedWeights, match="model.layers.0.mlp.up_proj"):
        load_drafter(drafter, other)
    second = load_drafter(drafter, kind)
    assert second.from_cache and second.weights == kind
    assert torch.equal(drafter_logits(second), drafter_logits(first))
    layer = Int4Linear if kind == "int4" else Int8Linear
    assert isinstance(second.model.model.layers[0].mlp.up_proj, layer)
    assert type(second.model.lm_head) is torch.nn.Linear  # left for the reduced head


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", ["nan", "truncate", "other-layers"])
def test_a_damaged_drafter_cache_is_rebuilt(tmp_path, caplog, kind, fault):
    _, drafter = save_pair(tmp_path)
    first = load_drafter(drafter, kind)
    path = weight_cache.cache_path(drafter, kind, "drafter")
    if fault == "nan":
        write_nan(path, first_scale(path))
    elif fault == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    else:  # a verified file that holds the layers with the LM head: a target's, under the drafter's name
        load_model(drafter, kind, "cpu")
        path.write_bytes(weight_cache.cache_path(drafter, kind).read_bytes())
    with caplog.at_level(logging.WARNING):
        second = load_drafter(drafter, kind)
    assert not second.from_cache
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path) in w or "does not match" in w for w in warnings), warnings
    assert torch.equal(drafter_logits(second), drafter_logits(first))
    third = load_drafter(drafter, kind)  # the rebuilt file verifies
    assert third.from_cache and torch.equal(drafter_logits(third), drafter_logits(first))


@pytest.mark.parametrize("kind", KINDS)
def test_one_folder_as_target_and_as_drafter_keeps_both_caches(tmp_path, kind):
    _, folder = save_pair(tmp_path)
    assert not load_model(folder, kind, "cpu").from_cache
    assert not load_drafter(folder, kind).from_cache
    target_file = weight_cache.cache_path(folder, kind)
    written = target_file.stat().st_mtime_ns
    assert load_model(folder, kind, "cpu").from_cache and load_drafter(folder, kind).from_cache
    assert target_file.stat().st_mtime_ns == written  # neither role rewrote the other's file


def test_a_drafter_whose_weights_hold_nan_is_refused_not_cached(tmp_path):
    _, drafter = save_pair(tmp_path)
    write_nan(drafter / "model.safetensors", "model.layers.1.self_attn.o_proj.weight")
    with pytest.raises(DamagedWeights, match=str(drafter)):
        load_drafter(drafter, "int4")
    assert not weight_cache.cache_path(drafter, "int4", "drafter").exists()


def test_the_drafter_next_to_a_gguf_target_loads_from_its_cache(tmp_path):
    """Session.load's own path: a GGUF target (precision "file") and a draft-model folder,
    whose weights drafter_weights picks; the second session's drafter is read from the cache
    and computes what the first one did."""
    from engine.core.settings import DecodeSettings
    from engine.session.compare import compare
    from engine.session.session import Session
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer

    _, drafter = save_pair(tmp_path)
    tokenizer = build_tokenizer()
    target = write_gguf(build_model("qwen2", len(tokenizer), layers=2), tokenizer, tmp_path / "target-q8_0.gguf", "Q8_0")
    settings = DecodeSettings(max_new_tokens=16)
    first = Session.load(target, drafter, "file", "cpu")
    weights = first.drafter_model.weights
    assert weights in ("int8", "int4") and not first.drafter_model.from_cache
    expected = compare(first, "def add(a, b):", settings)
    second = Session.load(target, drafter, "file", "cpu")
    assert second.drafter_model.from_cache and second.drafter_model.weights == weights
    result = compare(second, "def add(a, b):", settings)
    assert result.speculative.token_ids == expected.speculative.token_ids == result.plain.token_ids
    ids = first.encode("def add(a, b):")
    # What it proposes from (speculation's on/off steps follow measured timings, so not its counts).
    assert torch.equal(ModelRunner(second.drafter_model.model).forward(ids, n_logits=len(ids)),
                       ModelRunner(first.drafter_model.model).forward(ids, n_logits=len(ids)))
