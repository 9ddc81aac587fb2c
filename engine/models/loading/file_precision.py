"""A model's precision label from its files: how the GGUF file it is (or was converted from)
holds its weights. A converted folder's record says so without opening anything (no torch
import: the app asks on the GUI thread with ``open_file=False``); a .gguf file's name is read
from its header (engine.gguf's cached metadata: milliseconds once the cache holds the file).
"""
from __future__ import annotations

from pathlib import Path

from engine.core.paths import cache_dir
from engine.models.loading.conversion_record import read_record
from engine.models.planning.precision_labels import precision_label


def source_quantization(path: Path | str, open_file: bool = True) -> str | None:
    """How the GGUF file ``path`` is, or was converted from, holds its weights ("Q4_K_M"); "" for
    a conversion whose record does not say and whose file is gone; None for a model folder that
    did not come from a GGUF file. ``open_file`` False never reads a GGUF header (no torch
    import, no seconds of parsing on a GUI thread): "" where only the header would say."""
    path = Path(path)
    if path.name.lower().endswith(".gguf"):  # engine.gguf.is_gguf, without importing torch
        return quantization_of(path) if open_file else ""
    record = read_record(path)
    if record is None or not str(record.get("source", "")).endswith(".gguf"):
        return None
    if record.get("quantization"):
        return str(record["quantization"])
    gguf = cache_dir() / "gguf" / record["source"]
    return quantization_of(gguf) if open_file and gguf.is_file() else ""




def quantization_of(path: Path | str) -> str:
    """A .gguf file's quantization (engine.gguf reads its header; imports torch)."""
    from engine.gguf.metadata_cache import quantization_of as read

    return read(path)


def label_for(precision: str, path: Path | str | None) -> str:
    """``precision``'s label for the model at ``path`` (None: a model of unknown origin)."""
    return precision_label(precision, source_quantization(path) if path is not None else None)
