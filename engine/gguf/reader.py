"""Open a GGUF file (or a split set) memory-mapped: its metadata and zero-copy views of its tensors.

engine.gguf.header parses the header (gguf-py's ``GGUFReader`` gives the same values, but
takes ~9 s over a vocabulary's 150k-item arrays); nothing of the tensor data is read until
touched. Each tensor comes out as a torch view over a memory map of the file: quantized tensors
as uint8 ``[rows, row_bytes]`` (one row = one output row of a matrix, a whole number of
blocks), F32 / F16 / BF16 ones in their own dtype. The mapping is copy-on-write (``mode="c"``): pages stay the
file's (the OS may drop and re-read them) and a stray write can never reach the file.

Split models (``name-00001-of-00003.gguf``, llama.cpp's gguf-split) are opened as one: any of
the parts may be named, all must be present, the metadata comes from the first.

Every problem is a ``GgufError`` whose message names the file and the reason (bad magic,
truncated, a tensor type or architecture Tandem cannot run, missing metadata).
"""
from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from engine.gguf.header import SPLIT_NAME, GgufError, LongArray, read_split, split_parts

__all__ = ["SPLIT_NAME", "GgufError", "GgufFile", "GgufTensor", "LongArray", "from_table", "is_gguf", "open_gguf",
           "split_parts", "table_of"]

log = logging.getLogger(__name__)

_DENSE = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


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

    def release_pages(self, view: torch.Tensor) -> int:
        """Let the OS drop the pages of the file that ``view`` (a tensor's data, or part of it)
        has read: bytes no longer needed once a layer was converted from them. They are the
        file's, unwritten, so a later read would fetch them again. Returns the bytes released
        (whole pages inside the view; 0 where the OS offers no madvise)."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return 0
        start_ptr, nbytes = view.data_ptr(), view.numel() * view.element_size()
        for mapped in self._maps:
            base, size = mapped.ctypes.data, mapped.shape[0]
            if base <= start_ptr and start_ptr + nbytes <= base + size:
                start = -(-(start_ptr - base) // mmap.PAGESIZE) * mmap.PAGESIZE
                end = (start_ptr - base + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
                if end <= start:
                    return 0
                mapped._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)
                return end - start
        return 0


def is_gguf(path: Path | str) -> bool:
    return str(path).lower().endswith(".gguf")


def open_gguf(path: Path | str) -> GgufFile:
    """Open a GGUF file (or the split set it belongs to) without reading its tensor data."""
    headers = read_split(path)
    table = [{"name": t.name, "type": t.type_name, "shape": list(t.shape), "part": i, "offset": t.offset,
              "nbytes": t.nbytes} for i, header in enumerate(headers) for t in header.tensors]
    return from_table(tuple(h.path for h in headers), headers[0].metadata, table,
                      tuple(h.data_offset for h in headers))


def _view(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor's bytes (uint8, memory-mapped) as the torch view ``GgufTensor.data`` describes."""
    data = torch.from_numpy(raw)
    if type_name in _DENSE:
        return data.view(_DENSE[type_name]).view(shape)
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return data.view(rows, -1)


def from_table(parts: tuple[Path, ...], metadata: dict[str, object], table: list[dict],
               data_offsets: tuple[int, ...]) -> GgufFile:
    """Open ``parts`` from a tensor table (their headers' just read, or one saved earlier by
    engine.gguf.metadata_cache, so the headers need no parsing): each entry gives a tensor's
    name, type, shape, part and byte range. The caller has checked that the headers are the
    ones the table was made from."""
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
