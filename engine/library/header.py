"""A GGUF file's header as the model library reads it: metadata, tensor table and vocabulary.

engine.gguf.header parses the bytes (the one parser engine.gguf.reader opens models with); this
keeps what listing and matching need: the scalars and short arrays, the tensor table, and
``tokenizer.ggml.tokens`` decoded (~0.1 s for a 151,936-token vocabulary), other long arrays
(token types, merges) only stepped over. The tensor data is never read: only its extent is
checked against the file size, so a truncated download is named as such.

``GgufHeader`` offers the attributes engine.gguf.model's checks read from a ``GgufFile``
(``name``, ``architecture``, ``require``, ``metadata``, ``tensors``), so those checks and
their messages are the loader's own. Problems are ``GgufError`` naming the file and why.

Whatever a file holds, reading it ends in a header or one ``GgufError`` line: a split name that
cannot be (part 1 of 0), a part that is not a regular file (a FIFO would block the read), and
whatever else the parser stumbles on in hostile bytes (metadata arrays nested 100,000 deep
overflow its recursion) are caught here, at the library's edge, so one such file in another
app's folder is one unreadable row, never the end of a listing.
"""
from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from engine.gguf.header import SPLIT_NAME, GgufError, LongArray, TensorEntry, read_split, split_parts

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
    path = Path(path)
    name = display_name or path.name
    for part in model_parts(path):
        check_regular_file(part, display_name if part == path else None)
    try:
        parts = read_split(path, long_arrays={TOKENS_KEY}, display_name=display_name)
    except RecursionError:
        raise GgufError(f"{name} is corrupted (its metadata nests arrays deeper than any model's)") from None
    except (IndexError, KeyError, TypeError, OverflowError, ZeroDivisionError, struct.error) as exc:
        raise GgufError(f"{name} is corrupted (its header cannot be read: {one_line(exc)})") from None
    metadata = {k: v for k, v in parts[0].metadata.items() if not isinstance(v, LongArray) and not k.startswith("GGUF.")}
    tokens = metadata.pop(TOKENS_KEY, None)
    if isinstance(tokens, list) and all(isinstance(t, str) for t in tokens[:1]):
        metadata[TOKENS_KEY] = f"<{len(tokens)} tokens>"
    else:  # not a list of strings: no vocabulary this library can match on
        tokens = None
    tensors = {t.name: t for part in parts for t in part.tensors}
    return GgufHeader(tuple(p.path for p in parts), metadata, tensors, tokens,
                      display_name if len(parts) == 1 else None)


def check_split_name(path: Path) -> None:
    """GgufError where ``path``'s name says a split that cannot be: part 0, a 0-part model, a
    part past the count (``model-00001-of-00000.gguf``)."""
    match = SPLIT_NAME.match(Path(path).name)
    if match is None:
        return
    no, count = int(match["no"]), int(match["count"])
    if count < 1 or not 1 <= no <= count:
        raise GgufError(f"{Path(path).name} is misnamed: its name says part {no} of {count}, which no split model has")


def model_parts(path: Path | str) -> tuple[Path, ...]:
    """Every part of the (split) model ``path`` is part of; GgufError for a name that cannot be
    or a part that is missing."""
    path = Path(path)
    check_split_name(path)
    parts = split_parts(path)
    if not parts:  # split_parts found nothing to stand for the set
        raise GgufError(f"{path.name} names no part of a model")
    return parts


def check_regular_file(path: Path, display_name: str | None = None) -> None:
    """GgufError unless ``path`` is a regular file (not a FIFO, a device such as /dev/zero, a
    folder); OSError where it cannot be looked at."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise GgufError(f"{display_name or path} does not exist") from None
    if stat.S_ISDIR(mode):
        raise GgufError(f"{display_name or path} is a folder; a model is a .gguf file")
    if not stat.S_ISREG(mode):
        raise GgufError(f"{display_name or Path(path).name} is not a regular file (a device, FIFO or socket)")


def one_line(exc: BaseException, limit: int = 200) -> str:
    """``exc`` as one short line for a message: its type and first ``limit`` characters."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
