"""A GGUF file's header (metadata and tensor table) read in one pass over its bytes.

gguf-py's ``GGUFReader`` turns every metadata array item into numpy views of its own: ~9 s for
the default pair's files, whose headers hold 151,936 tokens, as many token types and 151,387
merges. This walks the same bytes with ``struct`` over a read-only memory map: scalars and
strings are decoded, arrays longer than ``MAX_ARRAY`` items are stepped over (their length is
kept as a ``LongArray``) unless the caller asks for them, numeric ones then in one numpy read.
Stepping over the vocabulary takes ~15 ms, decoding it ~50 ms: a loop of ``struct`` reads
beats a numpy pass, which still needs that loop to find where each string starts.

The values are gguf-py's: the same keys (``GGUF.version``, ``GGUF.tensor_count`` and
``GGUF.kv_count`` included), strings decoded as strict UTF-8, numbers as Python ints, floats
and bools, nested arrays flattened as ``ReaderField.contents()`` flattens them; the type
tables (value types, block sizes) are gguf-py's own. Tensor data is never read: each tensor's
extent is checked against the file size, so a truncated download is named as such.

Every problem is a ``GgufError`` naming the file and the reason.
"""
from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# llama.cpp's gguf-split naming: model-00001-of-00003.gguf
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
# Metadata arrays longer than this (the vocabulary, merges) are kept as their length only,
# unless asked for: only the tokenizer needs them, and it reads them itself.
MAX_ARRAY = 64
_MAGIC = b"GGUF"
_MAX_DIMS = 8  # ggml has 4; more is a corrupted count, not a tensor


class GgufError(ValueError):
    """A GGUF file Tandem cannot open or run; the message names the file and says why."""


@dataclass(frozen=True)
class LongArray:
    """Stands in for a metadata array longer than ``MAX_ARRAY`` items (its length only)."""

    length: int


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's table entry. ``shape`` is in PyTorch order (a matrix is [out, in]; GGUF lists
    dimensions the other way round); ``offset`` is where its bytes start in the file."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class PartHeader:
    """The header of one file: ``metadata`` by key, ``tensors`` in file order, ``data_offset``
    (where the tensor data starts: the header's end, aligned), ``size`` (the file's bytes)."""

    path: Path
    metadata: dict[str, object]
    tensors: tuple[TensorEntry, ...]
    data_offset: int
    size: int


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


def read_split(path: Path | str, long_arrays: Collection[str] | bool = (),
               display_name: str | None = None) -> tuple[PartHeader, ...]:
    """The headers of ``path`` or of the split set it belongs to (every part must be present),
    checked as one model: the part count the first part states, no tensor in two parts, the
    metadata's numbers against the tensors (engine.gguf.header_checks).
    ``long_arrays`` and ``display_name`` are as for ``read_part`` (the name only for a single file)."""
    path = Path(path)
    if not path.exists():
        raise GgufError(f"{display_name or path} does not exist")
    parts = split_parts(path)
    if len(parts) == 1:
        header = read_part(path, long_arrays, display_name)
        _check_numbers(display_name or path.name, (header,))
        return (header,)
    headers = tuple(read_part(part, long_arrays if i == 0 else ()) for i, part in enumerate(parts))
    seen: set[str] = set()
    for header in headers:
        for tensor in header.tensors:
            if tensor.name in seen:
                raise GgufError(f"{header.path.name}: tensor {tensor.name} appears twice in the split model")
            seen.add(tensor.name)
    metadata = headers[0].metadata
    count = metadata.get("split.count")
    if count is not None and int(count) != len(parts):
        raise GgufError(f"{parts[0].name} says the model has {count} parts, its name says {len(parts)}")
    expected = metadata.get("split.tensors.count")
    if expected is not None and int(expected) != len(seen):
        raise GgufError(f"{parts[0].name}: the split model should hold {expected} tensors, its parts hold {len(seen)}")
    _check_numbers(parts[0].name, headers)
    return headers


def _check_numbers(name: str, headers: tuple[PartHeader, ...]) -> None:
    """The first part's metadata against every part's tensors (engine.gguf.header_checks)."""
    from engine.gguf.header_checks import check_header  # it raises this module's GgufError

    check_header(name, headers[0].metadata, {t.name: t.shape for h in headers for t in h.tensors})


def read_part(path: Path | str, long_arrays: Collection[str] | bool = (),
              display_name: str | None = None) -> PartHeader:
    """The header of the one file ``path``. Arrays longer than ``MAX_ARRAY`` items come out whole
    where their key is in ``long_arrays`` (or it is True), else as ``LongArray``. ``display_name``
    names the file in messages where its own name says nothing (an Ollama blob)."""
    path = Path(path)
    name = display_name or path.name
    size = path.stat().st_size
    if size < 24:
        raise GgufError(f"{name} is not a GGUF file: it is only {size} bytes long")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != _MAGIC:
            magic = int.from_bytes(buf[:4], "little")
            raise GgufError(f"{name} is not a GGUF file (bad magic {magic:#010x}; expected 'GGUF'): "
                            "it may be corrupted or another format")
        parser = _Parser(buf, name, long_arrays)
        try:
            metadata, tensors, data_offset = parser.header()
        except _Truncated:
            raise GgufError(f"{name} is truncated or corrupted (its header runs past the end of the file "
                            f"at {size:,} bytes)") from None
        except UnicodeDecodeError as exc:
            raise GgufError(f"{name} is truncated or corrupted ({parser.where}: not UTF-8 text, {exc.reason})") from None
    for tensor in tensors:
        end = tensor.offset + tensor.nbytes
        if end > size:
            raise GgufError(f"{name} is truncated: tensor {tensor.name} ends at byte {end:,} but the file has {size:,} bytes")
    return PartHeader(path, metadata, tensors, data_offset, size)


# -- the bytes ---------------------------------------------------------------------------------


class _Truncated(Exception):
    pass


_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
# struct formats of gguf-py's scalar value types, by GGUFValueType name.
_SCALARS = {"UINT8": "<B", "INT8": "<b", "UINT16": "<H", "INT16": "<h", "UINT32": "<I", "INT32": "<i",
            "FLOAT32": "<f", "BOOL": "<?", "UINT64": "<Q", "INT64": "<q", "FLOAT64": "<d"}


class _Parser:
    """Reads one header from ``buf``; running past its end raises ``_Truncated``. ``where`` says
    what it was reading, for messages."""

    def __init__(self, buf, name: str, long_arrays: Collection[str] | bool) -> None:
        from gguf import GGUFValueType

        self.buf, self.pos, self.size, self.name = buf, 0, len(buf), name
        self.long_arrays = long_arrays
        self.types = GGUFValueType
        self.scalars = {GGUFValueType[k]: struct.Struct(fmt) for k, fmt in _SCALARS.items()}
        self.where = "the header"

    # primitives

    def u32(self) -> int:
        return self._unpack(_U32)

    def u64(self) -> int:
        return self._unpack(_U64)

    def _unpack(self, fmt: struct.Struct):
        if self.pos + fmt.size > self.size:
            raise _Truncated
        value = fmt.unpack_from(self.buf, self.pos)[0]
        self.pos += fmt.size
        return value

    def string(self) -> str:
        n = self.u64()
        if self.pos + n > self.size:
            raise _Truncated
        value = self.buf[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return value

    def value_type(self, raw: int):
        try:
            return self.types(raw)
        except ValueError:
            raise GgufError(f"{self.name}: {self.where} has an unknown value type {raw} "
                            "(the file may be corrupted)") from None

    # the header

    def header(self):
        self.pos = 4
        version = self.u32()
        if version not in (2, 3):
            if int.from_bytes(version.to_bytes(4, "little"), "big") in (2, 3):
                raise GgufError(f"{self.name} is a big-endian GGUF file; Tandem reads little-endian ones")
            raise GgufError(f"{self.name} is GGUF version {version}; Tandem reads versions 2 and 3")
        n_tensors, n_kv = self.u64(), self.u64()
        metadata: dict[str, object] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}
        alignment_type = None
        for _ in range(n_kv):
            self.where = "a metadata key"
            key = self.string()
            self.where = f"metadata '{key}'"
            if key in metadata:
                raise GgufError(f"{self.name} is truncated or corrupted (metadata '{key}' appears twice)")
            value_type = self.value_type(self.u32())
            if key == "general.alignment":
                alignment_type = value_type
            metadata[key] = self.value(value_type, key)
        entries = [self.tensor_entry() for _ in range(n_tensors)]
        names = [entry[0] for entry in entries]
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise GgufError(f"{self.name} is truncated or corrupted (tensor {twice} appears twice)")
        alignment = self.alignment(metadata.get("general.alignment"), alignment_type)
        data_offset = -(-self.pos // alignment) * alignment
        return metadata, tuple(self.tensor(data_offset, *entry) for entry in entries), data_offset

    def value(self, value_type, key: str):
        if value_type == self.types.STRING:
            return self.string()
        if value_type == self.types.ARRAY:
            if self.long_arrays is True or key in self.long_arrays:
                return self.array(self.value_type(self.u32()), self.u64())
            start = self.pos
            leaves = self.skip_array()
            if leaves <= MAX_ARRAY:
                self.pos = start  # short: read it again, item by item
                return self.array(self.value_type(self.u32()), self.u64())
            return LongArray(leaves)
        return self._unpack(self.scalars[value_type])

    def skip_array(self) -> int:
        """Steps over an array (its value type read already); returns how many items it holds,
        nested arrays counted through to their items, as gguf-py counts them."""
        item_type = self.value_type(self.u32())
        count = self.u64()
        if item_type == self.types.STRING:
            buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
            try:
                for _ in range(count):
                    pos += 8 + unpack(buf, pos)[0]
            except struct.error:
                raise _Truncated from None
            if pos > self.size:
                raise _Truncated
            self.pos = pos
            return count
        if item_type == self.types.ARRAY:
            return sum(self.skip_array() for _ in range(count))
        self.skip(self.scalars[item_type].size * count)
        return count

    def skip(self, n: int) -> None:
        if self.pos + n > self.size:
            raise _Truncated
        self.pos += n

    def array(self, item_type, count: int) -> list:
        """An array's items (after its type and count), nested arrays flattened."""
        if item_type == self.types.STRING:
            return [self.string() for _ in range(count)]
        if item_type == self.types.ARRAY:
            items: list = []
            for _ in range(count):
                items += self.array(self.value_type(self.u32()), self.u64())
            return items
        fmt = self.scalars[item_type]
        nbytes = fmt.size * count
        if self.pos + nbytes > self.size:
            raise _Truncated
        values = np.frombuffer(self.buf, dtype=np.dtype(fmt.format), count=count, offset=self.pos).tolist()
        self.pos += nbytes
        return values

    def tensor_entry(self) -> tuple[str, list[int], int, int]:
        self.where = "a tensor name"
        tensor_name = self.string()
        self.where = f"tensor {tensor_name}"
        n_dims = self.u32()
        if n_dims > _MAX_DIMS:
            raise GgufError(f"{self.name} is truncated or corrupted (tensor {tensor_name} claims {n_dims} dimensions)")
        dims = [self.u64() for _ in range(n_dims)]
        return tensor_name, dims, self.u32(), self.u64()

    def alignment(self, value, value_type) -> int:
        if value is None:
            return 32  # GGUF's default
        if value_type != self.types.UINT32 or value == 0 or value & (value - 1):
            raise GgufError(f"{self.name} is truncated or corrupted (general.alignment is {value!r}, "
                            "not a power of two stored as uint32)")
        return value

    def tensor(self, data_offset: int, tensor_name: str, dims: list[int], type_id: int, offset: int) -> TensorEntry:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise GgufError(f"{self.name} holds a tensor type this gguf library does not know ({type_id} in "
                            f"{tensor_name}); it may come from a newer llama.cpp") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        if dims and dims[0] % block:
            raise GgufError(f"{self.name} is truncated or corrupted (tensor {tensor_name}'s rows of {dims[0]} "
                            f"values are not whole {qtype.name} blocks of {block})")
        elements = 1
        for d in dims:
            elements *= d
        return TensorEntry(tensor_name, qtype.name, tuple(reversed(dims)), data_offset + offset,
                           elements * type_size // block)
