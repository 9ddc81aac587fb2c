"""Where each app's folder is looked for, and what a damaged or odd entry there turns into:
listed with the reason it cannot run, or skipped when it is not a model at all."""
from __future__ import annotations

import json

from engine.library import list_local_models
from engine.library.discovery import find_ollama, llama_cpp_root, ollama_roots
from tests.engine.library.conftest import place_llama_cpp, place_ollama


def test_folder_overrides(isolated_home, tmp_path, monkeypatch):
    assert llama_cpp_root() == tmp_path / "llama-cache"  # LLAMA_CACHE
    monkeypatch.delenv("LLAMA_CACHE")
    assert llama_cpp_root() == isolated_home / ".cache" / "llama.cpp"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert llama_cpp_root() == tmp_path / "xdg" / "llama.cpp"  # as llama.cpp's fs_get_cache_directory
    assert ollama_roots() == [tmp_path / "ollama"]  # OLLAMA_MODELS
    monkeypatch.delenv("OLLAMA_MODELS")
    assert ollama_roots()[0] == isolated_home / ".ollama" / "models"


def test_damaged_files_are_listed_with_the_reason(ggufs, tmp_path):
    cut = place_llama_cpp(tmp_path / "llama-cache", ggufs["target"], "org", "cut-GGUF")
    cut.write_bytes(cut.read_bytes()[:4000])
    place_ollama(tmp_path / "ollama", ggufs["mamba"], "tiny-mamba", tag="1b")
    models = {m.name: m for m in list_local_models()}
    assert set(models) == {"org/cut-GGUF/tiny-target-Q4_0", "tiny-mamba:1b"}
    damaged = models["org/cut-GGUF/tiny-target-Q4_0"]
    assert not damaged.runnable and damaged.drafting is None and damaged.architecture is None
    assert damaged.problem.startswith("org_cut-GGUF_tiny-target-Q4_0.gguf is truncated")
    # An Ollama blob is named by its model name in messages, not by its digest.
    assert models["tiny-mamba:1b"].problem.startswith("tiny-mamba:1b is a 'mamba' model")


def test_ollama_manifests_that_name_no_weights_are_skipped(ggufs, tmp_path):
    root = tmp_path / "ollama"
    blob = place_ollama(root, ggufs["drafter"], "tiny", tag="ok")
    manifests = root / "manifests" / "registry.ollama.ai" / "library" / "tiny"
    good = json.loads((manifests / "ok").read_text())
    missing = json.loads(json.dumps(good).replace(blob.name.removeprefix("sha256-"), "f" * 64))
    (manifests / "missing-blob").write_text(json.dumps(missing))
    escaping = json.loads(json.dumps(good).replace("sha256:" + blob.name.removeprefix("sha256-"), "sha256:../../x"))
    (manifests / "bad-digest").write_text(json.dumps(escaping))
    (manifests / "not-json").write_text("{")
    user = root / "manifests" / "registry.ollama.ai" / "someone" / "tiny" / "q8"
    user.parent.mkdir(parents=True)
    user.write_text(json.dumps(good))
    found = [(f.name, f.path) for f in find_ollama()]
    assert found == [("tiny:ok", blob), ("someone/tiny:q8", blob)]
    assert [m.name for m in list_local_models()] == ["tiny:ok"]  # one blob, listed once
