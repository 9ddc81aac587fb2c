"""Load a GGUF file as a runnable model: the one call engine.models.loading.loader makes."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from engine.gguf import metadata_cache
from engine.gguf.model import build_model, check_architecture, file_precision_label, quantization, read_config
from engine.gguf.reader import GgufFile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GgufModel:
    """A model computing on ``file``'s own weights. ``quantization``: how the file holds them
    ("Q4_K_M"); ``label``: the precision as the app shows it ("As in the file (Q4_K_M)")."""

    model: nn.Module
    tokenizer: object
    file: GgufFile
    quantization: str
    label: str
    seconds: float


def load_gguf(path: Path | str, with_tokenizer: bool = True) -> GgufModel:
    """Open ``path`` (a .gguf file, or any part of a split one) memory-mapped and build its
    model on the CPU, activations fp32. Raises ``GgufError`` (naming the file) for anything the
    file lacks or holds that Tandem cannot run."""
    start = time.perf_counter()
    file, entry = metadata_cache.open_cached(Path(path))
    check_architecture(file)
    config = metadata_cache.config(file, entry, read_config)
    model = build_model(file, config)
    tokenizer = metadata_cache.tokenizer(file, entry) if with_tokenizer else None
    seconds = time.perf_counter() - start
    kind = quantization(file)
    log.info("%s: %s model from its own %s weights in %.1fs", file.name, file.architecture, kind, seconds)
    return GgufModel(model, tokenizer, file, kind, file_precision_label(file), seconds)
