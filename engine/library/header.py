"""A GGUF file's header read in one pass: metadata, tensor table and the vocabulary's tokens.

gguf-py's ``GGUFReader`` (what engine.gguf.reader opens models with) turns every metadata
array item into its own numpy view: ~9.5 s for the 0.5B default drafter, whose header holds
151,936 tokens and 151,387 merges. Listing a folder of models cannot pay that per file, so
this walks the same header bytes with ``struct`` over a read-only memory map (~0.3 s there):
strings and short arrays are decoded, long numeric arrays skipped by their size, merges
stepped over, and ``tokenizer.ggml.tokens`` kept. The type tables (value types, block sizes)
are gguf-py's own. The tensor data is never read: only its extent is checked against the
file size, so a truncated download is named as such.

``GgufHeader`` offers the attributes engine.gguf.model's checks read from a ``GgufFile``
(``name``, ``architecture``, ``require``, ``metadata``, ``tensors``), so those checks and
their messages are the loader's own. Problems are ``GgufError`` naming the file and why.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from engine.gguf.reader import GgufError, split_parts

TOKENS_KEY = "tokenizer.ggml.tokens"
# Arrays up to this length are kept in ``metadata`` (as engine.gguf.reader keeps them).
_MAX_ARRAY = 64
_MAGIC = b"GGUF"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's table entry: ``shape`` in PyTorch order (a matrix is [out, in])."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass
class GgufHeader:
    """The header of a GGUF file or split set: ``metadata`` (scalars and short arrays, from the
    first part), ``tensors`` (from every part), ``tokens`` (the vocabulary in id order, or None
    when the file carries no tokenizer)."""

    paths: tuple[Path, ...]
    metadata: dict[str, object]
    tensors: dict[str, TensorInfo]
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
    if not path.exists():
        raise GgufError(f"{display_name or path} does not exist")
    parts = split_parts(path)
    metadata: dict[str, object] = {}
    tensors: dict[str, TensorInfo] = {}
    tokens = None
    for index, part in enumerate(parts):
        part_meta, part_tensors, part_tokens = _read_part(part, display_name if len(parts) == 1 else None)
        if index == 0:
            metadata, tokens = part_meta, part_tokens
        for tensor in part_tensors:
            if tensor.name in tensors:
                raise GgufError(f"{part.name}: tensor {tensor.name} appears twice in the split model")
            tensors[tensor.name] = tensor
    if len(parts) > 1:
        count = metadata.get("split.count")
        if count is not None and int(count) != len(parts):
            raise GgufError(f"{parts[0].name} says the model has {count} parts, its name says {len(parts)}")
        expected = metadata.get("split.tensors.count")
        if expected is not None and int(expected) != len(tensors):
            raise GgufError(f"{parts[0].name}: the split model should hold {expected} tensors, its parts hold {len(tensors)}")
    return GgufHeader(parts, metadata, tensors, tokens, display_name if len(parts) == 1 else None)


# -- one file -----------------------------------------------------------------------------------


class _Truncated(Exception):
    pass


class _Cursor:
    """Reads little-endian values from ``buf``; running past its end raises ``_Truncated``."""

    def __init__(self, buf) -> None:
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def take(self, fmt: str):
        n = struct.calcsize(fmt)
        if self.pos + n > self.size:
            raise _Truncated
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Truncated
        self.pos += n

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > self.size:
            raise _Truncated
        value = self.buf[self.pos:self.pos + n].decode("utf-8", errors="surrogateescape")
        self.pos += n
        return value


def _read_part(path: Path, display_name: str | None):
    name = display_name or path.name
    size = path.stat().st_size
    if size < 24:
        raise GgufError(f"{name} is not a GGUF file: it is only {size} bytes long")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != _MAGIC:
            magic = int.from_bytes(buf[:4], "little")
            raise GgufError(f"{name} is not a GGUF file (bad magic {magic:#010x}; expected 'GGUF'): "
                            "it may be corrupted or another format")
        try:
            return _parse(_Cursor(buf), name, size)
        except _Truncated:
            raise GgufError(f"{name} is truncated or corrupted (its header runs past the end of the file "
                            f"at {size:,} bytes)") from None


def _parse(cur: _Cursor, name: str, size: int):
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

    cur.skip(4)
    version = cur.take("<I")
    if version not in (2, 3):
        if int.from_bytes(version.to_bytes(4, "little"), "big") in (2, 3):
            raise GgufError(f"{name} is a big-endian GGUF file; Tandem reads little-endian ones")
        raise GgufError(f"{name} is GGUF version {version}; Tandem reads versions 2 and 3")
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    metadata: dict[str, object] = {}
    tokens = None
    for _ in range(n_kv):
        key = cur.string()
        value_type = _value_type(cur.take("<I"), GGUFValueType, name, key)
        if value_type == GGUFValueType.ARRAY:
            item_type = _value_type(cur.take("<I"), GGUFValueType, name, key)
            count = cur.take("<Q")
            if key == TOKENS_KEY and item_type == GGUFValueType.STRING:
                tokens = [cur.string() for _ in range(count)]
                metadata[key] = f"<{count} tokens>"
            elif count <= _MAX_ARRAY:
                metadata[key] = [_value(cur, item_type, GGUFValueType) for _ in range(count)]
            else:
                _skip_items(cur, item_type, count, GGUFValueType)
        else:
            metadata[key] = _value(cur, value_type, GGUFValueType)
    entries = []
    for _ in range(n_tensors):
        tensor_name = cur.string()
        n_dims = cur.take("<I")
        if n_dims > 8:
            raise GgufError(f"{name} is truncated or corrupted (tensor {tensor_name} claims {n_dims} dimensions)")
        dims = [cur.take("<Q") for _ in range(n_dims)]
        type_id, offset = cur.take("<I"), cur.take("<Q")
        entries.append((tensor_name, dims, type_id, offset))
    alignment = int(metadata.get("general.alignment", 32) or 32)
    data_start = -(-cur.pos // alignment) * alignment
    tensors = []
    for tensor_name, dims, type_id, offset in entries:
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise GgufError(f"{name} holds a tensor type this gguf library does not know ({type_id} in "
                            f"{tensor_name}); it may come from a newer llama.cpp") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        elements = 1
        for d in dims:
            elements *= d
        nbytes = elements // block * type_size
        end = data_start + offset + nbytes
        if end > size:
            raise GgufError(f"{name} is truncated: tensor {tensor_name} ends at byte {end:,} but the file has {size:,} bytes")
        tensors.append(TensorInfo(tensor_name, qtype.name, tuple(reversed(dims)), nbytes))
    return metadata, tensors, tokens


_SCALARS = {"UINT8": "<B", "INT8": "<b", "UINT16": "<H", "INT16": "<h", "UINT32": "<I", "INT32": "<i",
            "FLOAT32": "<f", "BOOL": "<?", "UINT64": "<Q", "INT64": "<q", "FLOAT64": "<d"}


def _value_type(raw: int, types, name: str, key: str):
    try:
        return types(raw)
    except ValueError:
        raise GgufError(f"{name}: metadata '{key}' has an unknown value type {raw} (the file may be corrupted)") from None


def _value(cur: _Cursor, value_type, types):
    if value_type == types.STRING:
        return cur.string()
    if value_type == types.ARRAY:  # nested arrays: llama.cpp writes none a model needs
        item_type = types(cur.take("<I"))
        _skip_items(cur, item_type, cur.take("<Q"), types)
        return None
    return cur.take(_SCALARS[value_type.name])


def _skip_items(cur: _Cursor, item_type, count: int, types) -> None:
    if item_type == types.STRING:
        for _ in range(count):
            cur.skip(cur.take("<Q"))
    elif item_type == types.ARRAY:
        for _ in range(count):
            _value(cur, types.ARRAY, types)
    else:
        cur.skip(struct.calcsize(_SCALARS[item_type.name]) * count)
