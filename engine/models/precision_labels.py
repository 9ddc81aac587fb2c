"""What a precision choice is called where a person chooses it (the app's combos, the CLI).

A model that came from a GGUF file already went through one rounding: its quantization
("Q4_K_M"). Precision "file" computes on exactly those weights; every other precision starts
from the dequantized copy (engine.models.default_pair.convert_gguf), stored in bf16: that copy
rounds most of the file's dequantized values (the fidelity benchmark found 3.2% unchanged), fp32
widens the rounded copy, and int8 / int4 round it once more. The labels say so; a model
that was 16-bit to begin with gets the plain names.

Reading a label costs no torch import where the quantization was recorded at conversion
(a converted folder's record); a .gguf file's name is read from its header (engine.gguf's
cached metadata: milliseconds once the cache holds the file).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

# Every precision, in the order a person is offered them for a model that was never quantized.
PLAIN_LABELS = {"fast": "bf16 (fast)", "exact": "fp32 (exact)", "int8": "int8 (quantized by Tandem)",
                "int4": "int4 (quantized by Tandem)"}
FOLDER_PRECISIONS = ("fast", "exact", "int8", "int4")


def precision_label(precision: str, quantization: str | None = None) -> str:
    """The name of ``precision`` for a model whose source file holds its weights as
    ``quantization`` ("Q4_K_M"; "" when the model came from a GGUF file of unknown type; None when
    it did not come from one)."""
    if precision == "file":
        return f"As in the file ({quantization})" if quantization else "As in the file"
    if precision not in PLAIN_LABELS:
        raise ValueError(f"unknown precision {precision!r}; choose from file, {', '.join(PLAIN_LABELS)}")
    if quantization is None:
        return PLAIN_LABELS[precision]
    source = f" from {quantization}" if quantization else ""
    return {"fast": f"bf16 (dequantized{source})", "exact": f"fp32 (exact, dequantized{source})",
            "int8": f"int8 (re-quantized{source})", "int4": f"int4 (re-quantized{source})"}[precision]


def source_quantization(path: Path | str, open_file: bool = True) -> str | None:
    """How the GGUF file ``path`` is, or was converted from, holds its weights ("Q4_K_M"); "" for
    a conversion whose record does not say and whose file is gone; None for a model folder that
    did not come from a GGUF file. ``open_file`` False never reads a GGUF header (no torch
    import, no seconds of parsing on a GUI thread): "" where only the header would say."""
    path = Path(path)
    if path.name.lower().endswith(".gguf"):  # engine.gguf.is_gguf, without importing torch
        return gguf_quantization(path) if open_file else ""
    record = _conversion_record(path)
    if record is None or not str(record.get("source", "")).endswith(".gguf"):
        return None
    if record.get("quantization"):
        return str(record["quantization"])
    from engine.core.paths import cache_dir

    gguf = cache_dir() / "gguf" / record["source"]
    return gguf_quantization(gguf) if open_file and gguf.is_file() else ""


def gguf_quantization(path: Path) -> str:
    """A .gguf file's quantization as its loader names it (engine.gguf.model.quantization)."""
    from engine.gguf.metadata_cache import open_cached
    from engine.gguf.model import quantization

    file, _ = open_cached(Path(path))
    return quantization(file)


def label_for(precision: str, path: Path | str | None) -> str:
    """``precision``'s label for the model at ``path`` (None: a model of unknown origin)."""
    return precision_label(precision, source_quantization(path) if path is not None else None)


def choices(quantization: str | None, with_file: bool | None = None) -> list[tuple[str, str]]:
    """(label, precision) pairs to offer for a model of that origin: "file" first where the model
    is a GGUF file (``with_file`` defaults to: it came from one and its name is known)."""
    if with_file is None:
        with_file = bool(quantization)
    first = [(precision_label("file", quantization), "file")] if with_file else []
    return first + [(precision_label(p, quantization), p) for p in FOLDER_PRECISIONS]


def _conversion_record(folder: Path) -> dict | None:
    from engine.models.default_pair import MARKER

    try:
        record = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


__all__ = ["FOLDER_PRECISIONS", "PLAIN_LABELS", "choices", "gguf_quantization", "label_for", "precision_label",
           "source_quantization"]
