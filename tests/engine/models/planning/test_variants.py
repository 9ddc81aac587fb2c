"""GGUF variants in the catalog: parsed and checked on load, sizes from llama.cpp's recipe
checked against real files and the Hub's listings, and a local file read from its header."""
import copy
import json
import re

import pytest

from engine.models.loading import default_pair
from engine.models.loading.gguf_sizes import local_file_size, local_variant
from engine.models.planning.catalog import CATALOG_PATH, CatalogError, find_entry, load_catalog
from engine.models.planning.variants import (
    SIZE_SOURCES,
    GgufVariant,
    recipe_embedding_bytes,
    recipe_file_bytes,
)


@pytest.fixture(scope="module")
def entries():
    return load_catalog(local_configs=False)


@pytest.fixture(scope="module")
def raw():
    return json.loads(CATALOG_PATH.read_text())


def arch_of(entries, repo):
    for e in entries:
        if e.target_repo == repo:
            return e.target_arch
        if e.drafter_repo == repo:
            return e.drafter_arch
    raise KeyError(repo)


def test_every_dense_text_model_has_gguf_variants_with_its_drafter(entries):
    by_id = {e.id: e for e in entries}
    for entry_id in ("qwen2.5-coder-7b", "qwen3-8b", "llama-3.1-8b"):
        e = by_id[entry_id]
        assert [v.quant for v in e.variants] == ["Q4_K_M", "Q5_K_M", "Q8_0"]
        assert e.drafter_variants and all(isinstance(v, GgufVariant) for v in e.drafter_variants)
        assert all(v.size_source in SIZE_SOURCES and v.file_bytes > 0 for v in (*e.variants, *e.drafter_variants))
    assert by_id["qwen2.5-coder-7b"].variants[0].repo == "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF"
    assert by_id["qwen3-8b"].variants[0].files == ("Qwen3-8B-Q4_K_M.gguf",)
    assert by_id["qwen2.5-coder-7b"].drafter_variants[0].files == ("Qwen2.5-Coder-0.5B-Instruct-Q8_0.gguf",)
    # No GGUF build Tandem can run for these (gemma4 / glm4moe are not engine.gguf architectures):
    # they stay safetensors.
    for entry_id in ("gemma-4-e4b", "gemma-4-31b", "glm-4.5-air"):
        assert by_id[entry_id].variants == ()
    offline = by_id["default-offline"]
    assert offline.variants[0].file_bytes == default_pair.TARGET.size and offline.variants[0].size_source == "file"
    assert offline.drafter_variants[0].file_bytes == default_pair.DRAFTER.size


def test_file_names_say_their_quantization(entries):
    for e in entries:
        for v in (*e.variants, *e.drafter_variants):
            assert all(v.quant.lower() in f.lower() for f in v.files), (e.id, v)


def test_recipe_gives_the_real_default_target_file_size(entries):
    arch = find_entry("default-offline", entries).target_arch
    computed = recipe_file_bytes(arch, "Q4_K_M")
    assert abs(computed - default_pair.TARGET.size) / default_pair.TARGET.size < 1e-4


def _listed_bytes(text: str) -> tuple[float, float]:
    number, unit = re.fullmatch(r"([\d.]+) (MB|GB)", text).groups()
    scale = 1e9 if unit == "GB" else 1e6
    half_step = 0.5 * 10 ** -len(number.partition(".")[2]) * scale  # the listing's rounding
    return float(number) * scale, half_step


def test_computed_sizes_match_the_hubs_listed_sizes(raw):
    checked = 0
    for repo, model in raw["models"].items():
        for record in model.get("gguf", []):
            if "hub_listed" in record:
                listed, half_step = _listed_bytes(record["hub_listed"])
                assert abs(record["file_bytes"] - listed) <= half_step + 0.002 * listed, (repo, record)
                checked += 1
    assert checked >= 10


def test_the_catalogs_computed_sizes_are_the_recipes(entries, raw):
    for repo, model in raw["models"].items():
        for record in model.get("gguf", []):
            if record["size_source"] == "computed":
                assert record["file_bytes"] == recipe_file_bytes(arch_of(entries, repo), record["quant"]), (repo, record)


def test_quantizations_order_by_size(entries):
    e = find_entry("qwen3-8b", entries)
    q4, q5, q8 = (v.file_bytes for v in e.variants)
    assert q4 < q5 < q8 < e.weight_bytes("bf16")
    assert recipe_embedding_bytes(e.target_arch, "Q4_K_M") > 0  # untied: the embedding is only looked up
    assert recipe_embedding_bytes(find_entry("qwen3-4b", entries).target_arch, "Q4_K_M") == 0  # tied: the head


def _broken(tmp_path, raw, change) -> str:
    data = copy.deepcopy(raw)
    change(data["models"]["Qwen/Qwen3-8B"]["gguf"])
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CatalogError) as err:
        load_catalog(path, local_configs=False)
    return str(err.value)


@pytest.mark.parametrize("change, words", [
    (lambda g: g[0].pop("repo"), "'repo' must be a Hub repo"),
    (lambda g: g[0].update(file_bytes="4.9 GB"), "'file_bytes' must be a positive whole number"),
    (lambda g: g[0].update(files=[]), "'files' must list the .gguf file(s)"),
    (lambda g: g[0].update(size_source="guess"), "'size_source' must be one of"),
    (lambda g: g[1].update(quant="Q4_K_M"), "Q4_K_M is listed twice"),
    (lambda g: g[0].update(files=["a-00002-of-00002.gguf", "a-00001-of-00002.gguf"]), "split files must be named"),
    (lambda g: g[0].update(sha="x"), "unknown field(s) sha"),
])
def test_a_malformed_variant_names_the_entry_and_model(tmp_path, raw, change, words):
    message = _broken(tmp_path, raw, change)
    assert message.startswith("entry qwen3-8b: catalog model Qwen/Qwen3-8B gguf[")
    assert words in message


def test_split_variants_list_every_part_in_order(tmp_path, raw):
    data = copy.deepcopy(raw)
    parts = [f"Qwen3-8B-Q8_0-0000{i}-of-00002.gguf" for i in (1, 2)]
    data["models"]["Qwen/Qwen3-8B"]["gguf"][2]["files"] = parts
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(data))
    q8 = find_entry("qwen3-8b", load_catalog(path, local_configs=False)).variants[2]
    assert q8.files == tuple(parts) and q8.split


@pytest.mark.slow  # the real default target in the user cache (its header table cached there: ~4 s)
def test_a_local_file_is_read_from_its_header():
    path = default_pair.gguf_file(default_pair.TARGET)
    size = local_file_size(path)
    assert size.quant == "Q4_K_M" and size.file_bytes == default_pair.TARGET.size
    assert size.tensor_bytes == 1_111_370_240  # the rest is the header: metadata and vocabulary
    assert size.embedding_bytes == 151936 * 1536 // 256 * 144  # token_embd, Q4_K, next to an output matrix
    variant = local_variant(path, "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF")
    assert variant.size_source == "file" and variant.files == (path.name,) and variant.tensor_bytes == size.tensor_bytes
