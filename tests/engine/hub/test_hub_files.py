"""Which files of a repo get fetched, and the tokenizer comparison (pure, no server)."""
import json

import pytest

from engine.hub.files import HubFile, NoUsableWeights, find_sidecar, select_files
from engine.hub.vocab_match import compare

BASE = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md", ".gitattributes"]


def listing(*names: str) -> list[HubFile]:
    return [HubFile(n, 10) for n in (*BASE, *names)]


def picked(files, **kw) -> list[str]:
    return [f.path for f in select_files(files, **kw)]


def test_safetensors_are_preferred_and_other_formats_skipped():
    files = listing("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                    "model.safetensors.index.json", "pytorch_model.bin", "model.Q4_K_M.gguf",
                    "onnx/model.onnx", "original/consolidated.00.pth", "model.fp16.safetensors")
    assert picked(files) == [
        "config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json",  # small files first...
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",  # ...then the weights
    ]


def test_a_precision_variant_picks_its_own_files():
    files = listing("model.safetensors", "model.fp16-00001-of-00002.safetensors",
                    "model.fp16-00002-of-00002.safetensors", "model.safetensors.index.fp16.json")
    assert [p for p in picked(files, precision="fp16") if "model" in p] == [
        "model.safetensors.index.fp16.json", "model.fp16-00001-of-00002.safetensors", "model.fp16-00002-of-00002.safetensors"]
    assert "model.safetensors" in picked(files, precision="fast")  # app precisions mean "the repo's own"
    with pytest.raises(NoUsableWeights, match="fp16"):
        select_files(listing("model.safetensors"), precision="fp16")


def test_other_formats_only_when_that_is_all_there_is():
    assert "pytorch_model.bin" in picked(listing("pytorch_model.bin", "training_args.bin"))
    assert "training_args.bin" not in picked(listing("pytorch_model.bin", "training_args.bin"))
    ggufs = listing("m-Q4_K_M.gguf", "m-Q8_0.gguf")
    assert picked(ggufs, precision="q8_0")[-1] == "m-Q8_0.gguf"
    with pytest.raises(NoUsableWeights, match="m-Q4_K_M.gguf"):
        select_files(ggufs)  # several quantizations: the caller must choose
    with pytest.raises(NoUsableWeights, match="no model weights"):
        select_files(listing())
    with pytest.raises(NoUsableWeights, match="config.json"):
        select_files([HubFile("model.safetensors", 1)])


def test_a_drafter_folder_inside_the_repo_is_found():
    files = listing("model.safetensors", "mtp/config.json", "mtp/model.safetensors", "docs/config.json")
    assert find_sidecar(files) == ("mtp", "mtp")
    assert picked(files, subfolder="mtp") == ["mtp/config.json", "mtp/model.safetensors"]
    assert find_sidecar(listing("model.safetensors", "assistant/config.json")) is None  # no weights there


def write_tokenizer(folder, vocab, added=()):
    folder.mkdir()
    data = {"model": {"type": "BPE", "vocab": vocab}, "added_tokens": [{"id": i, "content": c} for i, c in added]}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    (folder / "config.json").write_text(json.dumps({"vocab_size": len(vocab) + len(added)}))
    return folder


def test_vocabularies_are_compared_token_by_token(tmp_path):
    vocab = {"a": 0, "b": 1, "ab": 2}
    target = write_tokenizer(tmp_path / "t", vocab, [(3, "<eos>")])
    assert compare(target, write_tokenizer(tmp_path / "same", dict(vocab), [(3, "<eos>")])).same
    other = compare(target, write_tokenizer(tmp_path / "other", {"a": 0, "b": 1, "ba": 2}, [(3, "<eos>")]))
    assert not other.same and "id 2: 'ab' vs 'ba'" in other.reason
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 4}}))
    assert compare(target, bare).same  # no tokenizer shipped: the vocab sizes must agree
