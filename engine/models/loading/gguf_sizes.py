"""A GGUF file on this machine as a catalog variant: its quantization and sizes read from its
header (engine.gguf, through its metadata cache: parsing a 150k-token vocabulary takes
seconds, the cached table milliseconds). Reading a header imports torch, so this runs on a
worker; the fit (engine.models.planning) takes the variant it returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.models.planning.variants import GgufVariant


@dataclass(frozen=True)
class GgufFileSize:
    """What a local GGUF file holds, from its header: ``file_bytes`` on disk (all parts),
    ``tensor_bytes`` of tensor data, ``embedding_bytes`` of an input embedding that a separate
    output matrix leaves to row-by-row lookups (0 when the embedding is tied to the output)."""

    quant: str
    file_bytes: int
    tensor_bytes: int
    embedding_bytes: int


def local_file_size(path: Path | str) -> GgufFileSize:
    """Read ``path``'s header (any part of a split model)."""
    from engine.gguf.metadata_cache import open_cached
    from engine.gguf.model import quantization

    file, _ = open_cached(Path(path))
    tensors = file.tensors
    embedding = tensors.get("token_embd.weight")
    untied = embedding is not None and "output.weight" in tensors
    return GgufFileSize(quant=quantization(file), file_bytes=file.size,
                        tensor_bytes=sum(t.nbytes for t in tensors.values()),
                        embedding_bytes=embedding.nbytes if untied else 0)


def local_variant(path: Path | str, repo: str = "") -> GgufVariant:
    """A GGUF file on this machine as a variant (size_source "file"); ``repo`` where known."""
    path = Path(path)
    size = local_file_size(path)
    from engine.gguf.reader import split_parts

    return GgufVariant(size.quant, repo, tuple(p.name for p in split_parts(path)), size.file_bytes, "file",
                       tensor_bytes=size.tensor_bytes, embedding_bytes=size.embedding_bytes)
