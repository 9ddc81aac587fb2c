"""GGUF files damaged the ways a security review found that broke every listing: metadata
arrays nested past Python's recursion limit, tensors with zero-length dimensions, split names
that cannot be (part 1 of 0). Each is built from bytes (the nesting) or from a real tiny GGUF
file with a few header bytes changed (the dimensions), so the rest of the file is sound."""
from __future__ import annotations

import struct
from pathlib import Path

_STRING, _ARRAY, _UINT8 = 8, 9, 0


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def nested_arrays(path: Path, depth: int = 100_000) -> Path:
    """A GGUF v3 header with ``general.architecture`` and one metadata array nested ``depth``
    deep (each level one item: an array), its innermost an empty uint8 array."""
    value = struct.pack("<I", _ARRAY) + (struct.pack("<I", _ARRAY) + struct.pack("<Q", 1)) * depth
    value += struct.pack("<I", _UINT8) + struct.pack("<Q", 0)
    kvs = [("general.architecture", struct.pack("<I", _STRING) + _string("qwen2")), ("deep", value)]
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(_string(k) + v for k, v in kvs)
    path.write_bytes(header + b"\0" * 64)
    return path


def zero_dims(source: Path, path: Path, tensor: str = "blk.0.attn_q.weight") -> Path:
    """A copy of the GGUF file ``source`` whose ``tensor`` has every dimension 0 (its tensor
    table entry rewritten in place; nothing else changes)."""
    data = bytearray(Path(source).read_bytes())
    name = _string(tensor)
    at = data.index(name) + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    for i in range(n_dims):
        struct.pack_into("<Q", data, at + 4 + 8 * i, 0)
    path.write_bytes(data)
    return path
