"""engine.gguf.reader and metadata_cache on small GGUF files written here with gguf-py: zero-copy
tensor views, split models, the header cache, and a clear message for each kind of bad file."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from engine.gguf import metadata_cache
from engine.gguf.model import build_model as build_gguf_model
from engine.gguf.model import (
    check_architecture,
    check_tensor_types,
    quantization,
    read_config,
)
from engine.gguf.reader import GgufError, open_gguf, split_parts
from engine.testing.tiny_gguf import build_model, write_gguf
from engine.testing.tiny_models import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_model("qwen2", len(tokenizer))


def test_tensors_are_views_of_the_mapped_file(tmp_path, model, tokenizer):
    path = write_gguf(model, tokenizer, tmp_path / "m.gguf", "Q8_0")
    file = open_gguf(path)
    assert file.architecture == "qwen2" and file.name == "m.gguf"
    q = file.tensors["blk.0.attn_q.weight"]
    assert (q.type_name, q.shape, q.data.dtype, tuple(q.data.shape)) == ("Q8_0", (64, 64), torch.uint8, (64, 2 * 34))
    norm = file.tensors["blk.0.attn_norm.weight"]
    assert norm.data.dtype == torch.float32 and norm.shape == (64,)
    expected = model.model.layers[0].input_layernorm.weight.detach()
    assert torch.equal(norm.data, expected)
    # Zero-copy: both tensors' bytes lie inside the file's mapping, at their recorded offsets.
    mapping = file._maps[0]
    base = mapping.ctypes.data
    for t in (q, norm):
        assert base <= t.data.data_ptr() < base + mapping.shape[0]
        assert t.data.data_ptr() - base == t.offset
    assert file.metadata["qwen2.block_count"] == 2
    assert Counter(t.type_name for t in file.tensors.values())["Q8_0"] == 7 * 2 + 2  # 7 matrices a layer, the embedding and the head


def test_split_model_opens_as_one_from_any_part(tmp_path, model, tokenizer):
    single = open_gguf(write_gguf(model, tokenizer, tmp_path / "one.gguf", "Q4_0"))
    first = write_gguf(model, tokenizer, tmp_path / "split.gguf", "Q4_0", split_max_tensors=10)
    parts = split_parts(first)
    assert len(parts) > 2 and parts[0] == first
    for part in (parts[0], parts[-1]):
        split = open_gguf(part)
        assert split.paths == parts and split.metadata["qwen2.block_count"] == 2
        assert sorted(split.tensors) == sorted(single.tensors)
        for name, t in single.tensors.items():
            assert torch.equal(split.tensors[name].data, t.data), name
    parts[1].unlink()
    with pytest.raises(GgufError, match=f"{parts[1].name} is missing"):
        open_gguf(parts[0])


def test_truncated_file_names_the_file_and_the_reason(tmp_path, model, tokenizer):
    path = write_gguf(model, tokenizer, tmp_path / "cut.gguf", "Q8_0")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 5000])  # tensor data missing at the end
    with pytest.raises(GgufError, match=r"cut\.gguf is truncated"):
        open_gguf(path)
    path.write_bytes(data[:2000])  # inside the header (the vocabulary)
    with pytest.raises(GgufError, match=r"cut\.gguf is truncated or corrupted"):
        open_gguf(path)


def test_bad_magic_and_missing_file(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(4096))
    with pytest.raises(GgufError, match=r"notes\.gguf is not a GGUF file \(bad magic"):
        open_gguf(bad)
    with pytest.raises(GgufError, match="absent.gguf does not exist"):
        open_gguf(tmp_path / "absent.gguf")


def test_unsupported_tensor_type_is_refused_before_building(tmp_path, model, tokenizer):
    path = write_gguf(model, tokenizer, tmp_path / "iq.gguf", "Q8_0", types={"blk.1.ffn_up.weight": "IQ4_NL"})
    file = open_gguf(path)
    with pytest.raises(GgufError, match=r"iq\.gguf: tensor blk\.1\.ffn_up\.weight is IQ4_NL, which Tandem cannot compute"):
        check_tensor_types(file)
    with pytest.raises(GgufError, match="IQ4_NL"):
        build_gguf_model(file, read_config(file))


def test_unsupported_architecture_and_missing_metadata(tmp_path, model, tokenizer):
    other = open_gguf(write_gguf(model, tokenizer, tmp_path / "rwkv.gguf", architecture="rwkv6"))
    with pytest.raises(GgufError, match=r"rwkv\.gguf is a 'rwkv6' model; Tandem runs .*qwen2"):
        check_architecture(other)
    bare = open_gguf(write_gguf(model, tokenizer, tmp_path / "bare.gguf", skip_keys=("qwen2.block_count",)))
    with pytest.raises(GgufError, match=r"bare\.gguf: the file has no 'qwen2\.block_count' metadata"):
        check_architecture(bare)


def test_quantization_label_follows_the_tensors(tmp_path, model, tokenizer):
    assert quantization(open_gguf(write_gguf(model, tokenizer, tmp_path / "a.gguf", "Q4_0"))) == "Q4_0"
    # The file type says Q4_0, but most matrices are Q8_0: the label says what the file holds.
    mixed = {f"blk.{i}.{n}.weight": "Q8_0" for i in range(2) for n in ("ffn_up", "ffn_down", "ffn_gate", "attn_q", "attn_k")}
    assert quantization(open_gguf(write_gguf(model, tokenizer, tmp_path / "b.gguf", "Q4_0", types=mixed))) == "mostly Q8_0"


def test_header_cache_is_used_while_the_header_is_unchanged(tmp_path, model, tokenizer):
    path = write_gguf(model, tokenizer, tmp_path / "c.gguf", "Q8_0")
    first, entry = metadata_cache.open_cached(path)
    assert (entry / "tensors.json").exists()
    again, same_entry = metadata_cache.open_cached(path)
    assert same_entry == entry and again.metadata == first.metadata
    assert {n: (t.type_name, t.shape, t.offset) for n, t in again.tensors.items()} == \
           {n: (t.type_name, t.shape, t.offset) for n, t in first.tensors.items()}
    assert all(torch.equal(again.tensors[n].data, t.data) for n, t in first.tensors.items())
    # Another file at the same place (other types, so another header): the entry is rebuilt.
    write_gguf(model, tokenizer, path, "Q4_0")
    rebuilt, _ = metadata_cache.open_cached(path)
    assert rebuilt.tensors["blk.0.attn_q.weight"].type_name == "Q4_0"
    # A file cut short after it was cached is still refused, naming it.
    data = path.read_bytes()
    path.write_bytes(data[:-4096])
    with pytest.raises(GgufError, match=r"c\.gguf is truncated"):
        metadata_cache.open_cached(path)


def test_config_from_metadata(tmp_path, tokenizer):
    qwen3 = build_model("qwen3", len(tokenizer))  # head_dim 16; transformers maps none for qwen3 (its default: 128)
    file = open_gguf(write_gguf(qwen3, tokenizer, tmp_path / "q3.gguf"))
    config = read_config(file)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers, config.head_dim) == ("qwen3", 64, 2, 16)
    assert config.vocab_size == len(tokenizer) and not config.tie_word_embeddings
    assert np.isclose(config.rms_norm_eps, 1e-6)
