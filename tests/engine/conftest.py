"""Fixtures for the Hub download tests: tiny models served by the loopback fake Hub."""
from __future__ import annotations

import pytest

from tests.engine.hub.hub_server import FakeHub

TARGET, DRAFTER, OTHER_VOCAB = "org/tiny", "org/tiny-drafter", "other/tiny-vocab300"
WEIGHTS = "model.safetensors"
# GGUF files for the variant downloads (gguf_files): a target in two quantizations, one split.
SINGLE, DRAFT, DRAFT_Q8 = "tiny-Q4_0.gguf", "tiny-drafter-Q4_0.gguf", "tiny-drafter-Q8_0.gguf"
SPLIT_PARTS = 4


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """Tiny target + drafter sharing a tokenizer, and a drafter with another vocabulary."""
    from engine.testing.tiny_models import build_model, build_tokenizer, save_pair

    root = tmp_path_factory.mktemp("hub-models")
    target, drafter = save_pair(root)
    tok = build_tokenizer(vocab_size=300)
    other = root / "other-vocab"
    build_model(len(tok), hidden=32, layers=1, seed=3).save_pretrained(other)
    tok.save_pretrained(other)
    return {"target": target, "drafter": drafter, "other": other}


@pytest.fixture(scope="session")
def gguf_files(tmp_path_factory) -> dict[str, bytes]:
    """Repo path -> bytes: a Q4_0 target, the same target as Q8_0 in 4 parts, a Q8_0 drafter
    (the target's weights, perturbed: it agrees often, not always) and a Q4_0 drafter."""
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer, perturbed_copy

    folder = tmp_path_factory.mktemp("gguf-repos")
    tokenizer = build_tokenizer()
    target = build_model("qwen2", len(tokenizer), layers=2)
    drafter = perturbed_copy(target, 0.005, seed=7)  # agrees with the target often, not always
    write_gguf(target, tokenizer, folder / SINGLE, "Q4_0")
    write_gguf(target, tokenizer, folder / "tiny-Q8_0.gguf", "Q8_0", split_max_tensors=8)
    write_gguf(drafter, tokenizer, folder / DRAFT_Q8, "Q8_0")
    write_gguf(drafter, tokenizer, folder / DRAFT, "Q4_0")
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sum(n.startswith("tiny-Q8_0-") for n in files) == SPLIT_PARTS
    return files


@pytest.fixture
def fake_hub(model_dirs, tmp_path, monkeypatch):
    """A running Hub with target, drafter and a mismatched drafter; HF_* env pointing at it
    and at a fresh cache in tmp_path."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with FakeHub() as server:
        server.add_repo(TARGET, model_dirs["target"])
        server.add_repo(DRAFTER, model_dirs["drafter"])
        server.add_repo(OTHER_VOCAB, model_dirs["other"])
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server
