"""The GGUF models people already have: found where other apps keep them, or registered by hand.

    header         read a GGUF header fast (metadata, tensor table, vocabulary tokens)
    vocab          vocabulary fingerprints and where two token lists part
    summaries      header summaries cached by (path, size, mtime)
    registry       ``tandem import PATH``: files registered in place (data dir, atomic writes)
    discovery      LM Studio's, llama.cpp's and Ollama's folders, read only
    drafter_match  the drafter for a model, or why prompt lookup drafts instead
    listing        ``list_local_models()``: all of it, one list

The public API (frozen dataclasses in engine.library.local_model):

    list_local_models() -> list[LocalModel]     every local model, with ``drafting`` filled in
    import_model(path) -> LocalModel            register a file (GgufError says why not)
    forget(path) -> bool                        unregister it (the file stays)
    loadable_path(model_or_candidate) -> Path   what to give Session.load(..., precision="file")
    find_local_model(path) -> LocalModel | None
"""
from engine.library.listing import find_local_model, list_local_models, loadable_path
from engine.library.local_model import (
           DrafterCandidate,
           DrafterRefusal,
           Drafting,
           LocalModel,
           Summary,
)
from engine.library.registry import forget, import_model

__all__ = ["DrafterCandidate", "DrafterRefusal", "Drafting", "LocalModel", "Summary", "find_local_model", "forget",
           "import_model", "list_local_models", "loadable_path"]
