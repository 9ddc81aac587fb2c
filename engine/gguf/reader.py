"""Open a GGUF file (or a split set) memory-mapped: its metadata and zero-copy views of its tensors.

gguf-py's ``GGUFReader`` parses the file (it memory-maps it; nothing is read until touched).
Each tensor comes out as a torch view over that mapping: quantized tensors as uint8
``[rows, row_bytes]`` (one row = one output row of a matrix, a whole number of blocks), F32 /
F16 / BF16 ones in their own dtype. The mapping is copy-on-write (``mode="c"``): pages stay the
file's (the OS may drop and re-read them) and a stray write can never reach the file.

Split models (``name-00001-of-00003.gguf``, llama.cpp's gguf-split) are opened as one: any of
the parts may be named, all must be present, the metadata comes from the first.

Every problem is a ``GgufError`` whose message names the file and the reason (bad magic,
truncated, a tensor type or architecture Tandem cannot run, missing metadata).
"""
from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

# llama.cpp's gguf-split naming: model-00001-of-00003.gguf
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
# Metadata arrays longer than this (the vocabulary, merges) are not copied into ``metadata``:
# parsing 150k strings into Python objects takes seconds and only the tokenizer needs them.
_MAX_ARRAY = 64
_DENSE = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class GgufError(ValueError):
    """A GGUF file Tandem cannot open or run; the message names the file and says why."""


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of the file. ``shape`` is in PyTorch order (a matrix is [out, in]: GGUF lists
    dimensions the other way round). ``data`` is a view over the memory-mapped file: uint8
    [rows, row_bytes] for quantized types, else a tensor of ``shape`` in its own dtype."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    data: torch.Tensor
    path: Path
    offset: int = 0  # where its bytes start in ``path``

    @property
    def quantized(self) -> bool:
        return self.type_name not in _DENSE

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


@dataclass
class GgufFile:
    """An opened GGUF model: ``paths`` (one, or every part of a split), scalar ``metadata``
    (strings, numbers and short arrays; the vocabulary is left to the tokenizer), ``tensors`` by
    GGUF name, and ``data_offsets`` (where each file's tensor data starts: its header ends)."""

    paths: tuple[Path, ...]
    metadata: dict[str, object]
    tensors: dict[str, GgufTensor]
    data_offsets: tuple[int, ...] = ()
    _maps: list = field(default_factory=list, repr=False)  # keeps the mappings alive

    @property
    def path(self) -> Path:
        return self.paths[0]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.paths)

    def require(self, key: str) -> object:
        """A metadata value, or a GgufError naming the missing key."""
        if key not in self.metadata:
            raise GgufError(f"{self.name}: the file has no '{key}' metadata, which Tandem needs to build the model")
        return self.metadata[key]

    def type_counts(self) -> Counter:
        """How many tensors of each type the file holds (``{"Q4_K": 169, "F32": 141, ...}``)."""
        return Counter(t.type_name for t in self.tensors.values())


def is_gguf(path: Path | str) -> bool:
    return str(path).lower().endswith(".gguf")


def split_parts(path: Path) -> tuple[Path, ...]:
    """Every part of a split model given any one of them; just ``path`` when it is not split."""
    path = Path(path)
    match = SPLIT_NAME.match(path.name)
    if match is None:
        return (path,)
    count = int(match["count"])
    parts = tuple(path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        raise GgufError(f"{path.name} is part of a {count}-part model, but {', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} missing from {path.parent}")
    return parts


def open_gguf(path: Path | str) -> GgufFile:
    """Open a GGUF file (or the split set it belongs to) without reading its tensor data."""
    path = Path(path)
    if not path.exists():
        raise GgufError(f"{path} does not exist")
    parts = split_parts(path)
    metadata: dict[str, object] = {}
    tensors: dict[str, GgufTensor] = {}
    offsets, maps = [], []
    for index, part in enumerate(parts):
        reader = _read(part)
        maps.append(reader.data)
        offsets.append(int(reader.data_offset))
        if index == 0:
            metadata = _scalar_fields(reader)
        for tensor in reader.tensors:
            if tensor.name in tensors:
                raise GgufError(f"{part.name}: tensor {tensor.name} appears twice in the split model")
            tensors[tensor.name] = _tensor(tensor, part)
    _check_split(parts, metadata, len(tensors))
    return GgufFile(parts, metadata, tensors, tuple(offsets), maps)


def _read(path: Path):
    """gguf-py's reader over ``path``, with its failures turned into messages about the file."""
    from gguf import GGUFReader
    from gguf.constants import GGUF_MAGIC

    size = path.stat().st_size
    if size < 24:
        raise GgufError(f"{path.name} is not a GGUF file: it is only {size} bytes long")
    with open(path, "rb") as f:
        magic = int.from_bytes(f.read(4), "little")
    if magic != GGUF_MAGIC:
        raise GgufError(f"{path.name} is not a GGUF file (bad magic {magic:#010x}; expected 'GGUF'): "
                        "it may be corrupted or another format")
    try:
        reader = GGUFReader(path, "c")
    except ValueError as exc:
        # gguf-py names the enum for unknown tensor types ("... is not a valid GGMLQuantizationType").
        if "GGMLQuantizationType" in str(exc):
            raise GgufError(f"{path.name} holds a tensor type this gguf library does not know ({exc}); "
                            "it may come from a newer llama.cpp") from exc
        raise GgufError(f"{path.name} is truncated or corrupted ({_reason(exc, size)})") from exc
    except (IndexError, KeyError, OverflowError, UnicodeDecodeError, MemoryError) as exc:
        raise GgufError(f"{path.name} is truncated or corrupted ({_reason(exc, size)})") from exc
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise GgufError(f"{path.name} is truncated: tensor {tensor.name} ends at byte {end:,} "
                            f"but the file has {size:,} bytes")
    return reader


def _reason(exc: Exception, size: int) -> str:
    text = str(exc)
    if "reshape" in text or "out of bounds" in text or "index" in text.lower():
        return f"its header or tensor data runs past the end of the file at {size:,} bytes"
    return text or type(exc).__name__


def _tensor(tensor, path: Path) -> GgufTensor:
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    raw = np.asarray(tensor.data).reshape(-1).view(np.uint8)
    return GgufTensor(tensor.name, tensor.tensor_type.name, shape, _view(raw, tensor.tensor_type.name, shape), path,
                      int(tensor.data_offset))


def _view(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor's bytes (uint8, memory-mapped) as the torch view ``GgufTensor.data`` describes."""
    data = torch.from_numpy(raw)
    if type_name in _DENSE:
        return data.view(_DENSE[type_name]).view(shape)
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return data.view(rows, -1)


def from_table(parts: tuple[Path, ...], metadata: dict[str, object], table: list[dict],
               data_offsets: tuple[int, ...]) -> GgufFile:
    """Open ``parts`` from a tensor table saved earlier (engine.gguf.metadata_cache) without
    parsing their headers again: each entry gives a tensor's name, type, shape, part and byte
    range. The caller has checked that the headers are the ones the table was made from."""
    maps = [np.memmap(p, mode="c") for p in parts]
    tensors = {}
    for entry in table:
        part, offset, nbytes = int(entry["part"]), int(entry["offset"]), int(entry["nbytes"])
        if offset + nbytes > maps[part].shape[0]:
            raise GgufError(f"{parts[part].name} is truncated: tensor {entry['name']} ends at byte "
                            f"{offset + nbytes:,} but the file has {maps[part].shape[0]:,} bytes")
        shape = tuple(int(d) for d in entry["shape"])
        raw = maps[part][offset:offset + nbytes]
        tensors[entry["name"]] = GgufTensor(entry["name"], entry["type"], shape, _view(raw, entry["type"], shape),
                                            parts[part], offset)
    return GgufFile(parts, dict(metadata), tensors, data_offsets, maps)


def table_of(file: GgufFile) -> list[dict]:
    """``file``'s tensors as ``from_table`` reads them back (JSON-ready)."""
    index = {p: i for i, p in enumerate(file.paths)}
    return [{"name": t.name, "type": t.type_name, "shape": list(t.shape), "part": index[t.path], "offset": t.offset,
             "nbytes": t.nbytes} for t in file.tensors.values()]


def _scalar_fields(reader) -> dict[str, object]:
    from gguf import GGUFValueType

    values: dict[str, object] = {}
    for key, reader_field in reader.fields.items():
        if reader_field.types and reader_field.types[0] == GGUFValueType.ARRAY and len(reader_field.data) > _MAX_ARRAY:
            values[key] = LongArray(len(reader_field.data))
            continue
        try:
            values[key] = reader_field.contents()
        except (ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
            raise GgufError(f"{Path(reader.data.filename).name}: metadata '{key}' is unreadable ({exc})") from exc
    return values


@dataclass(frozen=True)
class LongArray:
    """Stands in for a long metadata array in ``GgufFile.metadata`` (its length only)."""

    length: int


def _check_split(parts: tuple[Path, ...], metadata: dict, n_tensors: int) -> None:
    if len(parts) == 1:
        return
    count = metadata.get("split.count")
    if count is not None and int(count) != len(parts):
        raise GgufError(f"{parts[0].name} says the model has {count} parts, its name says {len(parts)}")
    expected = metadata.get("split.tensors.count")
    if expected is not None and int(expected) != n_tensors:
        raise GgufError(f"{parts[0].name}: the split model should hold {expected} tensors, its parts hold {n_tensors}")
