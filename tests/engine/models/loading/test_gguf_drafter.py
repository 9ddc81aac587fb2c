"""A GGUF drafter held at int8 / int4: its decoder layers are the ones a converted folder of the
file's dequantized weights gets (same values, same rule), they go through the weight cache keyed
by the file, and the file's pages they were read from are released."""
from __future__ import annotations

import os

import pytest
import torch

from engine.gguf.modules import GgufEmbedding, GgufLinear
from engine.gguf.reader import open_gguf
from engine.models.loading.loader import load_model
from engine.models.runners.fused_runner import FusedRunner
from engine.quant import weight_cache
from engine.quant.quantize import Int4Linear, Int8Linear, pack_int8_layers, quantize_drafter
from engine.testing.tiny_gguf import build_model, dequantized_copy, write_gguf
from engine.testing.tiny_models import build_tokenizer

KINDS = ["int8", "int4"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def drafter_file(request, tmp_path_factory):
    """A Q8_0 drafter file (llama's stores its q / k rows permuted: the layers must undo that)."""
    tokenizer = build_tokenizer()
    model = build_model(request.param, len(tokenizer), layers=2, seed=4)
    return model, write_gguf(model, tokenizer, tmp_path_factory.mktemp("gguf-drafter") / "drafter-q8_0.gguf", "Q8_0")


def _layers(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, (Int8Linear, Int4Linear))}


@pytest.mark.parametrize("kind", KINDS)
def test_the_layers_are_the_folder_rule_applied_to_the_files_weights(drafter_file, kind):
    source, path = drafter_file
    loaded = load_model(path, "file", "cpu", role="drafter", weights=kind)
    assert loaded.weights == kind and loaded.quantization == "Q8_0"
    ours = _layers(loaded.model)
    # A converted folder of exactly the file's weights, quantized the folder's way.
    reference = dequantized_copy(source, path)
    quantize_drafter(reference, kind)
    if kind == "int8":
        pack_int8_layers(reference)
    theirs = _layers(reference)
    assert set(ours) == set(theirs) and len(ours) == 2 * 7
    for name, layer in ours.items():
        assert type(layer) is type(theirs[name]), name
        for buffer, value in theirs[name].named_buffers():
            assert torch.equal(getattr(layer, buffer), value), (name, buffer)
        if theirs[name].bias is not None:
            assert torch.equal(layer.bias, theirs[name].bias), name
    # The embedding and the head stay the file's (the pruned draft head reads the head's rows).
    assert isinstance(loaded.model.get_input_embeddings(), GgufEmbedding)
    assert isinstance(loaded.model.get_output_embeddings(), GgufLinear)
    # The fused int4 / int8 decoder layer runs it as it runs the folder's: the same hidden states
    # (the heads differ: the file's rows take block-quantized inputs).
    ids = list(range(5, 17))
    ours_hidden = FusedRunner(loaded.model).forward_hidden(ids, n_last=len(ids))
    assert torch.equal(ours_hidden, FusedRunner(reference).forward_hidden(ids, n_last=len(ids)))


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_load_reads_the_cache_and_a_replaced_file_is_converted_again(drafter_file, kind):
    _, path = drafter_file
    first = load_model(path, "file", "cpu", role="drafter", weights=kind)
    second = load_model(path, "file", "cpu", role="drafter", weights=kind)
    assert second.from_cache and second.weights == kind
    cache = weight_cache.cache_path(path, kind, "drafter")
    assert cache.exists() and not weight_cache.cache_path(path, kind, "target").exists()
    for name, layer in _layers(first.model).items():
        for buffer, value in layer.named_buffers():
            assert torch.equal(getattr(_layers(second.model)[name], buffer), value), (name, buffer)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file downloaded again
    third = load_model(path, "file", "cpu", role="drafter", weights=kind)
    assert not third.from_cache
    assert not cache.exists() and weight_cache.cache_path(path, kind, "drafter").exists()  # superseded, replaced


def test_a_16_bit_choice_runs_the_files_own_blocks(drafter_file):
    _, path = drafter_file
    loaded = load_model(path, "file", "cpu", role="drafter", weights="fp32")
    assert loaded.weights == "file" and not _layers(loaded.model)


def test_released_pages_read_back_the_same_bytes(tmp_path):
    """Releasing a tensor's pages drops them from memory, not from the file: read again, the
    bytes are the file's."""
    tokenizer = build_tokenizer()
    model = build_model("qwen2", len(tokenizer), hidden=256, layers=1, seed=2)
    file = open_gguf(write_gguf(model, tokenizer, tmp_path / "wide-q8_0.gguf", "Q8_0"))
    tensor = max(file.tensors.values(), key=lambda t: t.nbytes)
    assert tensor.nbytes > 3 * 4096
    before = tensor.data.clone()
    released = file.release_pages(tensor.data)
    assert 0 < released <= tensor.nbytes and released % 4096 == 0
    assert torch.equal(tensor.data, before)
    assert file.release_pages(tensor.data[:1, :8]) == 0  # less than a page: nothing to release
