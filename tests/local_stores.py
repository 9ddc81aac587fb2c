"""A home folder where every store the GGUF library reads or writes (LM Studio's and llama.cpp's
folders, Ollama's store, Tandem's own data) lies under tmp_path, for the tests that lay them out."""
from __future__ import annotations

from pathlib import Path


def isolate_local_stores(tmp_path: Path, monkeypatch) -> Path:
    """Point HOME, TANDEM_HOME, LLAMA_CACHE and OLLAMA_MODELS into ``tmp_path``; returns HOME."""
    from torch.utils.cpp_extension import get_default_build_root

    # The compiled kernels live under the real home's cache: keep finding them there (else the
    # first GGUF load under the fake home compiles them again, for minutes).
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", get_default_build_root())
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "tandem"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama-cache"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return home
