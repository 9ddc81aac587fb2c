"""What a precision choice is called where a person chooses it (the app's combos, the CLI).

A model that came from a GGUF file already went through one rounding: its quantization
("Q4_K_M"). Precision "file" computes on exactly those weights; every other precision starts
from the dequantized copy (engine.models.loading.default_pair.convert_gguf), stored in bf16: that copy
rounds most of the file's dequantized values (the fidelity benchmark found 3.2% unchanged), fp32
widens the rounded copy, and int8 / int4 round it once more. The labels say so; a model
that was 16-bit to begin with gets the plain names.

Only names here (no file is read: the picker calls these on the GUI thread);
engine.models.loading.file_precision finds a model's quantization from its files.
"""
from __future__ import annotations

# Every precision, in the order a person is offered them for a model that was never quantized.
PLAIN_LABELS = {"bf16": "bf16 (fast)", "fp32": "fp32 (exact)", "int8": "int8 (quantized by Tandem)",
                "int4": "int4 (quantized by Tandem)"}
FOLDER_PRECISIONS = ("bf16", "fp32", "int8", "int4")


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
    return {"bf16": f"bf16 (dequantized{source})", "fp32": f"fp32 (exact, dequantized{source})",
            "int8": f"int8 (re-quantized{source})", "int4": f"int4 (re-quantized{source})"}[precision]


def choices(quantization: str | None, with_file: bool | None = None) -> list[tuple[str, str]]:
    """(label, precision) pairs to offer for a model of that origin: "file" first where the model
    is a GGUF file (``with_file`` defaults to: it came from one and its name is known)."""
    if with_file is None:
        with_file = bool(quantization)
    first = [(precision_label("file", quantization), "file")] if with_file else []
    return first + [(precision_label(p, quantization), p) for p in FOLDER_PRECISIONS]


__all__ = ["FOLDER_PRECISIONS", "PLAIN_LABELS", "choices", "precision_label"]
