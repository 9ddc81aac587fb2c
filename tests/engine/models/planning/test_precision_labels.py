"""Precision labels: a GGUF file's own quantization, and what the other precisions do to a model
converted from one (dequantized, re-quantized), on tiny GGUF files and their converted folders."""
from __future__ import annotations

import json

import pytest

from engine.models.loading import conversion_record, default_pair
from engine.models.loading.file_precision import label_for, source_quantization
from engine.models.planning.precision_labels import choices, precision_label
from engine.testing.tiny_gguf import build_model, write_gguf
from engine.testing.tiny_models import build_tokenizer, save_pair


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny qwen2 GGUF file of Q8_0 blocks, and its folder converted as the default pair's is."""
    folder = tmp_path_factory.mktemp("gguf")
    tokenizer = build_tokenizer()
    path = write_gguf(build_model("qwen2", len(tokenizer)), tokenizer, folder / "tiny-q8_0.gguf", "Q8_0")
    return path


def test_plain_and_gguf_origins_are_named_apart():
    assert precision_label("file", "Q4_K_M") == "As in the file (Q4_K_M)"
    assert precision_label("bf16", "Q4_K_M") == "bf16 (dequantized from Q4_K_M)"
    assert precision_label("fp32", "Q4_K_M") == "fp32 (exact, dequantized from Q4_K_M)"
    assert precision_label("int8", "Q4_K_M") == "int8 (re-quantized from Q4_K_M)"
    assert precision_label("int4", "Q4_K_M") == "int4 (re-quantized from Q4_K_M)"
    assert precision_label("int4", "") == "int4 (re-quantized)"  # from a GGUF file of unknown type
    assert precision_label("bf16") == "bf16 (fast)" and precision_label("int4") == "int4 (quantized by Tandem)"
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        precision_label("fp8")


def test_a_gguf_file_is_labelled_with_its_own_quantization(tiny_gguf):
    assert source_quantization(tiny_gguf) == "Q8_0"
    assert label_for("file", tiny_gguf) == "As in the file (Q8_0)"
    assert source_quantization(tiny_gguf, open_file=False) == ""  # the header is never read then
    assert choices("Q8_0")[0] == ("As in the file (Q8_0)", "file")


def test_a_converted_folder_says_it_was_dequantized_and_records_why(tiny_gguf, tmp_path):
    folder = default_pair.convert_gguf(tiny_gguf, tmp_path / "converted")
    record = json.loads((folder / default_pair.MARKER).read_text())
    assert record["source"] == tiny_gguf.name and record["quantization"] == "Q8_0"
    # From the record alone: no GGUF header read, so a GUI thread may ask.
    assert source_quantization(folder, open_file=False) == "Q8_0"
    assert label_for("bf16", folder) == "bf16 (dequantized from Q8_0)"
    assert label_for("int4", folder) == "int4 (re-quantized from Q8_0)"
    assert [p for _, p in choices("Q8_0")] == ["file", "bf16", "fp32", "int8", "int4"]


def test_an_older_conversion_learns_its_quantization_from_its_gguf(tiny_gguf, tmp_path):
    from engine.core.paths import cache_dir

    folder = default_pair.convert_gguf(tiny_gguf, tmp_path / "converted")
    marker = folder / default_pair.MARKER
    record = json.loads(marker.read_text())
    del record["quantization"]  # as conversions made before the labels were
    marker.write_text(json.dumps(record))
    assert source_quantization(folder, open_file=False) == ""  # from a GGUF file, its type unknown
    assert label_for("int8", folder) == "int8 (re-quantized)"  # the file is not where the cache keeps it
    (cache_dir() / "gguf").mkdir(parents=True)
    (cache_dir() / "gguf" / tiny_gguf.name).write_bytes(tiny_gguf.read_bytes())
    assert source_quantization(folder) == "Q8_0"  # read from the file it names
    conversion_record.record_quantization(folder, cache_dir() / "gguf" / tiny_gguf.name)
    assert json.loads(marker.read_text())["quantization"] == "Q8_0"
    assert conversion_record.verify_converted(folder, full_check=True) is None  # the record still checks out


def test_a_model_that_was_never_quantized_gets_plain_names(tmp_path):
    target, _ = save_pair(tmp_path)
    assert source_quantization(target) is None
    assert label_for("bf16", target) == "bf16 (fast)"
    assert [label for label, _ in choices(None)] == ["bf16 (fast)", "fp32 (exact)", "int8 (quantized by Tandem)",
                                                     "int4 (quantized by Tandem)"]
