"""Damaged caches are found and rebuilt, never decoded into garbage: NaN bytes, truncation and
deletion of an int8 / int4 weight cache and of a converted default-pair model; temporaries
that killed runs leave are removed (by name and age) and counted by the disk checks; the
target's first logits are checked as a last guard."""
import json
import logging
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.core import scratch_files
from engine.core.events import Failed, Tokens
from engine.core.settings import DecodeSettings
from engine.models.loading import conversion_record, default_pair
from engine.models.loading.loader import load_model
from engine.models.runners.runner import ModelRunner
from engine.quant import weight_cache
from engine.quant.quantize import DamagedWeights
from engine.testing.tiny_models import build_model, build_tokenizer, save_pair

KINDS = ["int8", "int4"]
NAN_BYTES = {"F32": b"\x00\x00\xc0\x7f", "F16": b"\x00\x7e", "BF16": b"\xc0\x7f"}


def tensor_bytes_at(path: Path, name: str) -> tuple[int, int, str]:
    """(file offset, length, dtype) of tensor ``name`` in a safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    start, end = header[name]["data_offsets"]
    return 8 + n + start, end - start, header[name]["dtype"]


def write_nan(path: Path, name: str) -> None:
    """Overwrite the first value of tensor ``name`` with NaN, in place, as a bad write would."""
    offset, _, dtype = tensor_bytes_at(path, name)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(NAN_BYTES[dtype])


def first_scale(path: Path) -> str:
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return sorted(k for k in header if k.endswith(".scale"))[0]


def logits(loaded, text="def add(a, b):"):
    return ModelRunner(loaded.model).forward(loaded.tokenizer(text)["input_ids"])


# --- int8 / int4 weight caches ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_nan_in_a_cached_scale_is_found_and_the_cache_rebuilt(tmp_path, caplog, kind):
    target, _ = save_pair(tmp_path)
    first = load_model(target, kind, "cpu")
    path = weight_cache.cache_path(target, kind)
    write_nan(path, first_scale(path))
    with caplog.at_level(logging.WARNING):
        second = load_model(target, kind, "cpu")
    assert not second.from_cache
    assert any(str(path) in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
    assert torch.isfinite(logits(second)).all() and torch.equal(logits(second), logits(first))
    third = load_model(target, kind, "cpu")  # the rebuilt file verifies
    assert third.from_cache and torch.equal(logits(third), logits(first))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", ["truncate", "delete", "no-digest"])
def test_a_truncated_missing_or_unsigned_cache_is_rebuilt(tmp_path, caplog, kind, fault):
    from safetensors.torch import load_file, save_file

    target, _ = save_pair(tmp_path)
    first = load_model(target, kind, "cpu")
    path = weight_cache.cache_path(target, kind)
    if fault == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    elif fault == "delete":
        path.unlink()
    else:  # as an earlier version wrote it: no digest in the header
        save_file(load_file(path), str(path), metadata={f"tandem_{kind}_version": "1"})
    with caplog.at_level(logging.WARNING):
        second = load_model(target, kind, "cpu")
    assert not second.from_cache and torch.equal(logits(second), logits(first))
    if fault != "delete":
        assert any(str(path) in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert weight_cache.load(target, kind) is not None  # rewritten, with its digest


def test_weights_holding_nan_are_refused_not_cached(tmp_path):
    target, _ = save_pair(tmp_path)
    write_nan(target / "model.safetensors", "model.layers.1.mlp.up_proj.weight")
    with pytest.raises(DamagedWeights, match="model.layers.1.mlp.up_proj"):
        load_model(target, "int8", "cpu")
    assert not weight_cache.cache_path(target, "int8").exists()


# --- the last guard: the target's first logits ---------------------------------------------


def test_nan_logits_at_the_first_step_fail_naming_the_model(tmp_path):
    from engine.session.session import Session

    target, drafter = save_pair(tmp_path)
    write_nan(target / "model.safetensors", "model.layers.0.self_attn.q_proj.weight")
    session = Session.load(target, drafter, "bf16", "cpu")
    ids = session.encode("def add(a, b):")
    for events in (session.plain(ids, DecodeSettings(max_new_tokens=8)),
                   session.speculative(ids, DecodeSettings(max_new_tokens=8))):
        seen = list(events)
        assert not [e for e in seen if isinstance(e, Tokens)]
        [failed] = [e for e in seen if isinstance(e, Failed)]
        assert str(target) in failed.error and "NaN or infinite logits" in failed.error


def test_compare_says_so_instead_of_printing_garbage(tmp_path, capsys):
    from engine.cli import main

    target, drafter = save_pair(tmp_path)
    write_nan(target / "model.safetensors", "model.layers.0.self_attn.q_proj.weight")
    code = main(["compare", "def add(a, b):", "--target", str(target), "--drafter-model", str(drafter),
                 "--max-new-tokens", "8", "--drafter-head", "full"])
    out, err = capsys.readouterr()
    assert code == 1 and "outputs: identical" not in out
    assert "NaN or infinite logits" in err and str(target) in err


# --- temporaries of killed runs -------------------------------------------------------------


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_stale_temporaries_are_removed_by_name_and_age(tmp_path):
    target, _ = save_pair(tmp_path)
    cache = weight_cache.cache_path(target, "int8")
    cache.parent.mkdir(parents=True)
    live = os.getpid()
    old = cache.with_suffix(f".tmp{live}")  # our name, untouched for an hour: abandoned
    young = cache.with_suffix(".tmp1")  # our name, just written (pid 1 lives): in use
    dead_writer = cache.with_suffix(".tmp999999999")  # our name, its writer gone a minute ago
    foreign = cache.parent / "notes.tmp12"  # not a name we write
    for path in (old, young, dead_writer, foreign):
        path.write_bytes(b"x" * 1000)
    _age(old, 3600)
    _age(dead_writer, 60)
    _age(foreign, 3600)
    assert weight_cache.remove_stale_temporaries() == 2000
    assert not old.exists() and not dead_writer.exists()
    assert young.exists() and foreign.exists()


def test_loading_removes_a_first_load_killed_mid_write(tmp_path):
    target, _ = save_pair(tmp_path)
    cache = weight_cache.cache_path(target, "int8")
    cache.parent.mkdir(parents=True)
    orphan = cache.with_suffix(".tmp999999999")
    orphan.write_bytes(b"\0" * 4096)
    _age(orphan, 3600)
    loaded = load_model(target, "int8", "cpu")
    assert not orphan.exists() and not loaded.from_cache and cache.exists()


def test_the_disk_check_counts_what_unfinished_temporaries_hold(tmp_path):
    target, _ = save_pair(tmp_path)
    cache = weight_cache.cache_path(target, "int8")
    cache.parent.mkdir(parents=True)
    busy = cache.with_suffix(".tmp1")  # a write in progress (or killed moments ago): kept
    busy.write_bytes(b"\0" * 3_000_000)
    tensors = {"w.q": torch.zeros(1000, 1000, dtype=torch.int8), "w.scale": torch.ones(1000)}
    with pytest.raises(scratch_files.NotEnoughDisk) as caught:
        weight_cache.save(target, tensors, free=lambda path: 500_000)
    message = str(caught.value)
    assert "the int8 weight cache of tiny-target needs 2.1 MB free" in message and "only 500.0 kB are free" in message
    assert f"3.0 MB more are held by unfinished temporary files of Tandem ({busy.name})" in message
    assert not cache.exists() and busy.exists()


# --- the converted default pair ---------------------------------------------------------------


def write_tiny_gguf(path: Path) -> Path:
    """A tiny Qwen2 GGUF (F32 tensors, the BPE tokenizer as tokenizer.ggml.* keys) that
    transformers converts as it converts the real default pair's files."""
    import gguf

    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), hidden=64, layers=2, seed=3)
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_bos_token_id(vocab["<|endoftext|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(False)
    layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight", "self_attn.o_proj.weight": "attn_output.weight",
             **{f"self_attn.{x}_proj.{p}": f"attn_{x}.{p}" for x in "qkv" for p in ("weight", "bias")}}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight",
             **{f"model.layers.{i}.{hf}": f"blk.{i}.{g}" for i in range(cfg.num_hidden_layers) for hf, g in layer.items()}}
    for hf_name, tensor in model.state_dict().items():
        writer.add_tensor(names[hf_name], tensor.detach().float().numpy().copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def tiny_spec(tmp_path, monkeypatch):
    """A GgufSpec for a tiny model shipped as two part modules, as the real pair is on PyPI."""
    import hashlib

    data = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    parts = tmp_path / "parts"
    parts.mkdir()
    modules = []
    for i, chunk in enumerate((data[: len(data) // 2], data[len(data) // 2:]), 1):
        (parts / f"tiny_part{i}.bin").write_bytes(chunk)
        (parts / f"tiny_gguf_part{i}.py").write_text(
            f"def get_part_path():\n    return {str(parts / f'tiny_part{i}.bin')!r}\n")
        modules.append(f"tiny_gguf_part{i}")
    monkeypatch.syspath_prepend(str(parts))
    for name in modules:
        sys.modules.pop(name, None)
    return default_pair.GgufSpec("tiny-model", "tiny.gguf", tuple(modules), hashlib.sha256(data).hexdigest(), len(data))


@pytest.mark.parametrize("fault", ["nan", "truncate", "delete", "delete-tokenizer"])
def test_a_damaged_converted_model_is_converted_again_from_its_gguf(tiny_spec, caplog, fault):
    folder = default_pair.prepare(tiny_spec)
    weights = folder / "model.safetensors"
    original = conversion_record.file_digest(weights)
    if fault == "nan":
        write_nan(weights, "model.layers.0.mlp.up_proj.weight")
    elif fault == "truncate":
        os.truncate(weights, weights.stat().st_size - 4096)
    elif fault == "delete":
        weights.unlink()
    else:
        (folder / "tokenizer.json").unlink()
    with caplog.at_level(logging.WARNING):
        assert default_pair.prepare(tiny_spec) == folder
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "converting it again from its GGUF file" in warning and str(folder) in warning
    assert conversion_record.file_digest(weights) == original
    assert conversion_record.verify_converted(folder, full_check=True) is None
    loaded = load_model(folder, "bf16", "cpu")
    assert torch.isfinite(logits(loaded)).all()


def test_a_conversion_an_earlier_version_made_is_checked_once_and_its_digests_recorded(tiny_spec, caplog):
    folder = default_pair.prepare(tiny_spec)
    marker = folder / default_pair.MARKER
    marker.write_text(json.dumps({"source": "tiny.gguf", "dtype": "bfloat16"}))  # no digests
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.WARNING):
        default_pair.prepare(tiny_spec)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # not converted again
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert "model.safetensors" in json.loads(marker.read_text())["files"]
    # The same without digests and with a NaN inside: converted again.
    marker.write_text(json.dumps({"source": "tiny.gguf", "dtype": "bfloat16"}))
    write_nan(folder / "model.safetensors", "model.layers.1.self_attn.v_proj.weight")
    with caplog.at_level(logging.WARNING):
        default_pair.prepare(tiny_spec)
    assert any("holds NaN or infinite values" in r.getMessage() for r in caplog.records)
    assert conversion_record.verify_converted(folder, full_check=True) is None


def _warnings(caplog) -> list[str]:
    found = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    caplog.clear()
    return found


def test_setup_verifies_every_file_it_reports_ready(tiny_spec, monkeypatch, capsys, caplog):
    """`tandem setup` hashes what it calls ready, even where the quick check trusts a file's
    stamp: the record's digest no longer matching while size, mtime and ctime do is what a bad
    sector looks like."""
    from engine.cli import main

    monkeypatch.setattr(default_pair, "TARGET", tiny_spec)
    monkeypatch.setattr(default_pair, "DRAFTER", tiny_spec)
    folder = default_pair.prepare(tiny_spec)
    load_model(folder, "int8", "cpu")  # an int8 cache for setup to verify
    int8 = weight_cache.cache_path(folder, "int8")
    caplog.set_level(logging.WARNING)
    assert main(["setup"]) == 0
    out = capsys.readouterr().out
    assert f"int8 weight cache verified: {int8}" in out and "verified and ready" in out
    assert _warnings(caplog) == []

    write_nan(int8, first_scale(int8))
    assert main(["setup"]) == 0
    [warning] = _warnings(caplog)
    assert str(int8) in warning and "damaged" in warning
    assert not int8.exists() and "int8 weight cache verified" not in capsys.readouterr().out

    load_model(folder, "int8", "cpu")  # rebuilt
    marker = folder / default_pair.MARKER
    record = json.loads(marker.read_text())
    record["files"]["model.safetensors"]["xxh3_128"] = "0" * 32
    marker.write_text(json.dumps(record))
    assert conversion_record.verify_converted(folder) is None  # the stamps match: the quick check trusts them
    assert main(["setup"]) == 0
    [warning] = _warnings(caplog)
    assert "model.safetensors is damaged" in warning and "converting it again" in warning
    assert conversion_record.verify_converted(folder, full_check=True) is None
    assert not int8.exists()  # the cache of the weights replaced is removed too, unread
    assert not list(int8.parent.glob("tiny-model-*"))


def test_conversion_checks_the_disk_before_dequantizing(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(scratch_files.NotEnoughDisk, match="converting tiny.gguf needs"):
        default_pair.convert_gguf(gguf, tmp_path / "models" / "tiny", free=lambda path: 1000)
    assert not (tmp_path / "models" / "tiny").exists()
