"""Tiny GGUF files (written with gguf-py) and a home folder laid out like LM Studio's, llama.cpp's
and Ollama's stores, for the library tests. Every path the library reads or writes points
into tmp_path: HOME, TANDEM_HOME, LLAMA_CACHE, OLLAMA_MODELS."""
from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.local_stores import isolate_local_stores


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    return isolate_local_stores(tmp_path, monkeypatch)


@pytest.fixture(autouse=True)
def tiny_models_on_one_thread(one_torch_thread):
    """Tiny models: a parallel region costs more than the work."""


def _truncated_copy(model, layers: int):
    """``model`` keeping only its first ``layers`` layers: a smaller drafter that often agrees."""
    small = copy.deepcopy(model)
    small.model.layers = torch.nn.ModuleList(list(small.model.layers)[:layers])
    small.config.num_hidden_layers = layers
    if getattr(small.config, "layer_types", None):
        small.config.layer_types = small.config.layer_types[:layers]
    return small


@pytest.fixture(scope="package")
def ggufs(tmp_path_factory) -> dict[str, Path]:
    """target (4 layers, Q4_0), drafter (its first 2 layers, Q8_0), other_vocab (a 300-token
    tokenizer), mamba (an architecture Tandem cannot run, the target's vocabulary), split (the
    target in 3 parts)."""
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer

    folder = tmp_path_factory.mktemp("ggufs")
    tokenizer = build_tokenizer()
    target = build_model("qwen2", len(tokenizer), layers=4)
    other_tokenizer = build_tokenizer(vocab_size=300)
    (folder / "split").mkdir()
    return {
        "target": write_gguf(target, tokenizer, folder / "tiny-target-Q4_0.gguf", "Q4_0"),
        "drafter": write_gguf(_truncated_copy(target, 2), tokenizer, folder / "tiny-drafter-Q8_0.gguf", "Q8_0"),
        "other_vocab": write_gguf(build_model("qwen2", len(other_tokenizer), layers=1), other_tokenizer,
                                  folder / "other-vocab-Q8_0.gguf", "Q8_0"),
        "mamba": write_gguf(build_model("qwen2", len(tokenizer), layers=1), tokenizer, folder / "tiny-mamba-Q8_0.gguf",
                            "Q8_0", architecture="mamba"),
        "split": write_gguf(target, tokenizer, folder / "split" / "tiny-split-Q8_0.gguf", "Q8_0", split_max_tensors=20),
    }


def place_lmstudio(home: Path, source: Path, publisher: str, repo: str) -> Path:
    dest = home / ".lmstudio" / "models" / publisher / repo / source.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, dest)
    return dest


def place_llama_cpp(cache: Path, source: Path, owner: str, repo: str) -> Path:
    """As llama.cpp's -hf download names it: <owner>_<repo>_<file>, next to its manifest."""
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / f"{owner}_{repo}_{source.name}"
    shutil.copy(source, dest)
    (cache / f"manifest={owner}={repo}=latest.json").write_text(json.dumps({"ggufFile": {"rfilename": source.name}}))
    return dest


def place_ollama(root: Path, source: Path, model: str, tag: str = "latest", namespace: str = "library") -> Path:
    """An Ollama pull: the weights as a content-addressed blob, and a manifest naming it (plus a
    template layer, which is not weights)."""
    data = source.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / f"sha256-{digest}").write_bytes(data)
    template = b"{{ .Prompt }}"
    template_digest = hashlib.sha256(template).hexdigest()
    (blobs / f"sha256-{template_digest}").write_bytes(template)
    manifest = root / "manifests" / "registry.ollama.ai" / namespace / model / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64, "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{template_digest}", "size": len(template)},
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)},
        ],
    }))
    return blobs / f"sha256-{digest}"


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``roots`` with its size and mtime: discovery must leave these alone."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for root in roots for p in sorted(root.rglob("*")) if p.is_file()}
