"""Fixtures for the Hub download tests: tiny models served by the loopback fake Hub."""
from __future__ import annotations

import pytest

from tests.engine.hub_server import FakeHub

TARGET, DRAFTER, OTHER_VOCAB = "org/tiny", "org/tiny-drafter", "other/tiny-vocab300"
WEIGHTS = "model.safetensors"


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
