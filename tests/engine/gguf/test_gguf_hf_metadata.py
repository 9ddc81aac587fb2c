"""engine.gguf.hf_metadata against transformers' own GGUF path (gguf-py re-reading the header):
the same checkpoint dict, config and tokenizer, on tiny GGUF files of each architecture and
(slow) on the default pair's real files."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from engine.gguf import hf_metadata, metadata_cache
from engine.gguf.header import LongArray, read_part
from engine.gguf.model import read_config
from engine.gguf.reader import open_gguf
from engine.testing.tiny_gguf import build_model, write_gguf
from engine.testing.tiny_models import build_tokenizer

ARCHS = ["qwen2", "qwen3", "llama"]
TEXTS = [
    "def add(a, b):\n    return a + b  # The quick brown fox\n",
    "  leading spaces,\ttabs\n\n\nand blank lines   ",
    "Résumé, naïve café — 東京 and emoji 🙂 🤖 (unseen: ✓ Ω ß)",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "",
]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "for i in range(3): print(i)"}]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def files(tokenizer, tmp_path_factory):
    """{arch: path}, each file alone in its folder (as transformers is handed it). The llama
    one has a tied head, so tie_word_embeddings is read both ways."""
    root = tmp_path_factory.mktemp("gguf-files")
    paths = {}
    for arch in ARCHS:
        (root / arch).mkdir()
        model = build_model(arch, len(tokenizer), tie_word_embeddings=arch == "llama")
        paths[arch] = write_gguf(model, tokenizer, root / arch / f"tiny-{arch}.gguf", "Q8_0")
    return paths


def _transformers_config(path: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


def _transformers_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def assert_same_tokenizer(got, want) -> None:
    assert type(got) is type(want)
    assert got.get_vocab() == want.get_vocab() and len(got) == len(want)
    assert got.backend_tokenizer.to_str() == want.backend_tokenizer.to_str()
    for text in TEXTS:
        assert got.encode(text) == want.encode(text), text
        assert got.decode(got.encode(text)) == want.decode(want.encode(text))
    assert got.chat_template == want.chat_template
    if want.chat_template:
        assert got.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False) == \
            want.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert got.special_tokens_map == want.special_tokens_map and got.all_special_ids == want.all_special_ids
    assert (got.eos_token_id, got.bos_token_id, got.pad_token_id, got.unk_token_id) == \
        (want.eos_token_id, want.bos_token_id, want.pad_token_id, want.unk_token_id)
    assert got.init_kwargs == want.init_kwargs  # what save_pretrained writes into the cache entry


@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoint_dict_is_load_gguf_checkpoints(files, arch):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = files[arch]
    header = read_part(path, long_arrays=True)
    got = hf_metadata.checkpoint_dict(header.metadata, [t.name for t in header.tensors])
    want = load_gguf_checkpoint(str(path), return_tensors=False)
    assert got == want
    assert got["config"]["tie_word_embeddings"] is (arch == "llama")


@pytest.mark.parametrize("arch", ARCHS)
def test_config_is_transformers(files, arch):
    path = files[arch]
    header = read_part(path)  # long arrays as their lengths, as engine.gguf keeps them
    want = _transformers_config(path)
    got = hf_metadata.read_config(path, header.metadata, [t.name for t in header.tensors])
    assert type(got) is type(want) and got.to_dict() == want.to_dict()
    # Through engine.gguf: the metadata from the header, then from the cache entry's JSON table,
    # with the one correction model.read_config makes (transformers maps no head size for qwen3).
    if arch == "qwen3":
        want.head_dim = 16
    for _ in range(2):
        file, _entry = metadata_cache.open_cached(path)
        assert read_config(file).to_dict() == want.to_dict()


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_is_transformers(files, arch, tmp_path):
    path = files[arch]
    want = _transformers_tokenizer(path)
    got = hf_metadata.read_tokenizer(path, open_gguf(path).tensors)
    assert_same_tokenizer(got, want)
    # And what the cache entry keeps of it reads back the same.
    got.save_pretrained(tmp_path / "ours")
    want.save_pretrained(tmp_path / "theirs")
    for saved in sorted((tmp_path / "theirs").iterdir()):
        assert (tmp_path / "ours" / saved.name).read_bytes() == saved.read_bytes(), saved.name


def test_a_file_it_does_not_reproduce_loads_through_transformers(files, tokenizer, tmp_path, caplog):
    """A tokenizer.json beside the GGUF file (transformers would read it) and a config value
    engine.gguf kept as a length: both go through transformers' own path, and say so."""
    folder = tmp_path / "with-tokenizer-json"
    folder.mkdir()
    path = folder / files["qwen2"].name
    path.write_bytes(files["qwen2"].read_bytes())
    tokenizer.backend_tokenizer.save(str(folder / "tokenizer.json"))
    file, entry = metadata_cache.open_cached(path)
    with pytest.raises(hf_metadata.NotHandledHere, match="tokenizer.json"):
        hf_metadata.read_tokenizer(path, file.tensors)
    with caplog.at_level(logging.INFO, logger="engine.gguf"):
        assert_same_tokenizer(metadata_cache.tokenizer(file, entry), _transformers_tokenizer(path))
    assert "tokenizer through transformers' GGUF reader" in caplog.text

    file = open_gguf(files["llama"])
    file.metadata["llama.context_length"] = LongArray(100)  # as if it were a 100-item array
    with pytest.raises(hf_metadata.NotHandledHere, match="max_position_embeddings"):
        hf_metadata.read_config(file.path, file.metadata, file.tensors)
    with caplog.at_level(logging.INFO, logger="engine.gguf"):
        assert read_config(file).to_dict() == _transformers_config(file.path).to_dict()
    assert "config through transformers' GGUF reader" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("role", ["TARGET", "DRAFTER"])
def test_the_default_pairs_files(role):
    """The real files (151,936 tokens, 151,387 merges): the same dict, config and tokenizer."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair

    spec = getattr(default_pair, role)
    path = cache_dir() / "gguf" / spec.filename
    if not path.exists() or path.stat().st_size != spec.size:
        pytest.skip(f"{spec.filename} is not assembled here (run tandem setup)")
    header = read_part(path, long_arrays=True)
    names = [t.name for t in header.tensors]
    assert hf_metadata.checkpoint_dict(header.metadata, names) == load_gguf_checkpoint(str(path), return_tensors=False)
    got = hf_metadata.read_config(path, read_part(path).metadata, names)
    assert got.to_dict() == _transformers_config(path).to_dict()
    assert_same_tokenizer(hf_metadata.read_tokenizer(path, names), _transformers_tokenizer(path))
