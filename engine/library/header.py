"""A GGUF file's header as the model library reads it: metadata, tensor table and vocabulary.

engine.gguf.header parses the bytes (the one parser engine.gguf.reader opens models with); this
keeps what listing and matching need: the scalars and short arrays, the tensor table, and
``tokenizer.ggml.tokens`` decoded (~0.1 s for a 151,936-token vocabulary), other long arrays
(token types, merges) only stepped over. The tensor data is never read: only its extent is
checked against the file size, so a truncated download is named as such.

``GgufHeader`` offers the attributes engine.gguf.model's checks read from a ``GgufFile``
(``name``, ``architecture``, ``require``, ``metadata``, ``tensors``), so those checks and
their messages are the loader's own. Problems are ``GgufError`` naming the file and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.gguf.header import GgufError, LongArray, TensorEntry, read_split

TOKENS_KEY = "tokenizer.ggml.tokens"


@dataclass
class GgufHeader:
    """The header of a GGUF file or split set: ``metadata`` (scalars and short arrays, from the
    first part), ``tensors`` (from every part), ``tokens`` (the vocabulary in id order, or None
    when the file carries no tokenizer)."""

    paths: tuple[Path, ...]
    metadata: dict[str, object]
    tensors: dict[str, TensorEntry]
    tokens: list[str] | None = field(default=None, repr=False)
    display_name: str | None = None  # how messages name it where the file name says nothing

    @property
    def path(self) -> Path:
        return self.paths[0]

    @property
    def name(self) -> str:
        return self.display_name or self.path.name

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    def require(self, key: str) -> object:
        if key not in self.metadata:
            raise GgufError(f"{self.name}: the file has no '{key}' metadata, which Tandem needs to build the model")
        return self.metadata[key]

    @property
    def parameter_count(self) -> int:
        total = 0
        for tensor in self.tensors.values():
            count = 1
            for d in tensor.shape:
                count *= d
            total += count
        return total


def read_header(path: Path | str, display_name: str | None = None) -> GgufHeader:
    """The header of ``path`` (or of the split set it belongs to: every part must be present).
    ``display_name`` names the file in messages where its own name says nothing (an Ollama blob)."""
    parts = read_split(path, long_arrays={TOKENS_KEY}, display_name=display_name)
    metadata = {k: v for k, v in parts[0].metadata.items() if not isinstance(v, LongArray) and not k.startswith("GGUF.")}
    tokens = metadata.pop(TOKENS_KEY, None)
    if isinstance(tokens, list) and all(isinstance(t, str) for t in tokens[:1]):
        metadata[TOKENS_KEY] = f"<{len(tokens)} tokens>"
    else:  # not a list of strings: no vocabulary this library can match on
        tokens = None
    tensors = {t.name: t for part in parts for t in part.tensors}
    return GgufHeader(tuple(p.path for p in parts), metadata, tensors, tokens,
                      display_name if len(parts) == 1 else None)
