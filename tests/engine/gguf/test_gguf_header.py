"""engine.gguf.header reads what gguf-py's GGUFReader reads (the reference): every metadata value
with its Python type, in order, and the tensor table; engine.gguf.reader's files built on it
hold the values and bytes the gguf-py reader gave. Damaged headers are refused naming the file
and the reason. The default pair's real files are checked in a slow test."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.gguf.header import MAX_ARRAY, GgufError, LongArray, read_part
from engine.gguf.reader import open_gguf, split_parts
from engine.testing.tiny_gguf import build_model, write_gguf
from engine.testing.tiny_models import build_tokenizer

LONG = MAX_ARRAY + 36


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf-header")
    tokenizer = build_tokenizer()
    model = build_model("qwen2", len(tokenizer))
    mixed = {"blk.0.ffn_up.weight": "F16", "blk.0.attn_q.weight": "Q4_0", "blk.1.ffn_down.weight": "Q5_1",
             "blk.1.attn_k.weight": "F32"}
    return {
        "q8_0": write_gguf(model, tokenizer, folder / "tiny-Q8_0.gguf", "Q8_0"),
        "mixed": write_gguf(model, tokenizer, folder / "tiny-mixed.gguf", "Q8_0", types=mixed),
        "split": write_gguf(model, tokenizer, folder / "tiny-split.gguf", "Q4_0", split_max_tensors=10),
        "every_type": _every_value_type(folder / "every-type.gguf"),
    }


def _every_value_type(path: Path) -> Path:
    """A file holding each GGUF value type, as a scalar and in short and long arrays, nested
    arrays, non-ASCII text and a custom alignment."""
    import gguf
    from gguf import GGUFValueType as T

    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_custom_alignment(64)
    scalars = {T.UINT8: 200, T.INT8: -100, T.UINT16: 60000, T.INT16: -30000, T.UINT32: 4_000_000_000,
               T.INT32: -2_000_000_000, T.UINT64: 2**63 + 5, T.INT64: -(2**62), T.FLOAT32: 0.1, T.FLOAT64: 0.1,
               T.BOOL: True}
    for vtype, value in scalars.items():
        writer.add_key_value(f"tandem.{vtype.name.lower()}", value, vtype)
        short = [value, value] if vtype == T.BOOL else [value, 0]
        writer.add_key_value(f"tandem.short.{vtype.name.lower()}", short, T.ARRAY, sub_type=vtype)
        long = [bool(i % 3) for i in range(LONG)] if vtype == T.BOOL else [value if i % 2 else i for i in range(LONG)]
        writer.add_key_value(f"tandem.long.{vtype.name.lower()}", long, T.ARRAY, sub_type=vtype)
    writer.add_string("tandem.text", "héllo wörld ✓ 🙂")
    writer.add_string("tandem.empty", "")
    writer.add_array("tandem.strings", ["a", "", "ĠΓ", "日本語"])
    writer.add_array("tandem.long_strings", [f"tök{i}" * (i % 5) for i in range(LONG)])
    writer.add_array("tandem.nested", [[1, 2], [3, 4, 5]])
    writer.add_array("tandem.nested_strings", [["x", "yz"], ["ü"]])
    writer.add_array("tandem.empty_array", [])
    writer.add_tensor("weight", np.arange(64 * 32, dtype=np.float32).reshape(64, 32))
    writer.add_tensor("half", np.ones((3, 32), dtype=np.float16))
    writer.add_tensor("bias", np.zeros(7, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _typed(value):
    """``value`` with every item's Python type beside it (1, 1.0 and True are equal otherwise)."""
    if isinstance(value, list):
        return ["list", [_typed(v) for v in value]]
    return [type(value).__name__, value]


def _reference(path: Path):
    """gguf-py's reading of ``path``: (reader, every field's contents, the tensor table)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    metadata = {key: field.contents() for key, field in reader.fields.items()}
    table = [(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())), int(t.data_offset),
              int(t.n_bytes)) for t in reader.tensors]
    return reader, metadata, table


def _assert_part_matches_gguf_py(path: Path) -> None:
    reader, metadata, table = _reference(path)
    full = read_part(path, long_arrays=True)
    assert list(full.metadata) == list(metadata)
    assert _typed(list(full.metadata.values())) == _typed(list(metadata.values()))
    assert [(t.name, t.type_name, t.shape, t.offset, t.nbytes) for t in full.tensors] == table
    assert full.data_offset == reader.data_offset
    # By default long arrays stand as their length, as engine.gguf.reader has always kept them.
    short = read_part(path).metadata
    long_keys = {k for k, f in reader.fields.items() if f.types and f.types[0].name == "ARRAY" and len(f.data) > MAX_ARRAY}
    assert {k: v for k, v in short.items() if isinstance(v, LongArray)} == \
           {k: LongArray(len(reader.fields[k].data)) for k in long_keys}
    assert _typed([v for k, v in short.items() if k not in long_keys]) == \
           _typed([v for k, v in metadata.items() if k not in long_keys])


@pytest.mark.parametrize("which", ["q8_0", "mixed", "split", "every_type"])
def test_header_matches_gguf_py(files, which):
    for part in split_parts(files[which]):
        _assert_part_matches_gguf_py(part)


def test_every_value_type_is_read(files):
    # Not only equal to gguf-py's: present, so a reference that skipped them would show.
    metadata = read_part(files["every_type"], long_arrays=True).metadata
    assert metadata["tandem.text"] == "héllo wörld ✓ 🙂" and metadata["general.alignment"] == 64
    assert metadata["tandem.nested"] == [1, 2, 3, 4, 5] and metadata["tandem.nested_strings"] == ["x", "yz", "ü"]
    assert len(metadata["tandem.long_strings"]) == LONG and metadata["tandem.uint64"] == 2**63 + 5
    assert metadata["tandem.long.bool"][:3] == [False, True, True]


@pytest.mark.parametrize("which", ["mixed", "split", "every_type"])
def test_opened_file_holds_gguf_py_values_and_bytes(files, which):
    from gguf import GGUFReader

    file = open_gguf(files[which])
    assert file.paths == split_parts(files[which])
    readers = [GGUFReader(p) for p in file.paths]
    assert file.data_offsets == tuple(int(r.data_offset) for r in readers)
    fields = readers[0].fields
    assert _typed(list(file.metadata.values())) == _typed(
        [LongArray(len(f.data)) if f.types[0].name == "ARRAY" and len(f.data) > MAX_ARRAY else f.contents()
         for f in fields.values()]) and list(file.metadata) == list(fields)
    theirs = {t.name: (path, t) for path, r in zip(file.paths, readers) for t in r.tensors}
    assert list(file.tensors) == list(theirs)
    for name, ours in file.tensors.items():
        path, t = theirs[name]
        assert (ours.path, ours.type_name, ours.offset, ours.nbytes) == (path, t.tensor_type.name, int(t.data_offset),
                                                                         int(t.n_bytes)), name
        assert ours.data.numpy().tobytes() == np.asarray(t.data).tobytes(), name


def _patched(source: Path, dest: Path, old: bytes, new: bytes, after: int = 0) -> Path:
    """``source`` with the bytes ``after`` past the first ``old`` replaced by ``new``."""
    data = bytearray(source.read_bytes())
    at = data.index(old) + after
    data[at:at + len(new)] = new
    dest.write_bytes(bytes(data))
    return dest


def test_damaged_headers_are_refused_naming_the_file_and_the_reason(files, tmp_path):
    source = files["every_type"]
    key = b"tandem.uint8"
    cases = [
        (b"GGUF", (7).to_bytes(4, "little"), 4, r"v7\.gguf is GGUF version 7; Tandem reads versions 2 and 3"),
        (b"GGUF", (3).to_bytes(4, "big"), 4, r"big\.gguf is a big-endian GGUF file"),
        (key, (99).to_bytes(4, "little"), len(key), r"type\.gguf: metadata 'tandem\.uint8' has an unknown value type 99"),
        (key, b"tandem.int16", 0, r"twice\.gguf is truncated or corrupted \(metadata 'tandem\.int16' appears twice\)"),
        ("héllo".encode(), b"\xff", 1, r"utf8\.gguf is truncated or corrupted \(metadata 'tandem\.text': not UTF-8"),
        (b"general.alignment", (48).to_bytes(4, "little"), len(b"general.alignment") + 4,
         r"align\.gguf is truncated or corrupted \(general\.alignment is 48"),
        (b"tandem.long_strings", (2**40).to_bytes(8, "little"), len(b"tandem.long_strings") + 8,
         r"count\.gguf is truncated or corrupted \(its header runs past the end of the file"),
    ]
    names = ["v7", "big", "type", "twice", "utf8", "align", "count"]
    for name, (old, new, after, message) in zip(names, cases):
        path = _patched(source, tmp_path / f"{name}.gguf", old, new, after)
        with pytest.raises(GgufError, match=message):
            read_part(path)
        with pytest.raises(GgufError, match=message):
            open_gguf(path)


@pytest.mark.slow
def test_default_pair_headers_match_gguf_py():
    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair

    for spec in (default_pair.TARGET, default_pair.DRAFTER):
        path = cache_dir() / "gguf" / spec.filename
        if not path.exists() or path.stat().st_size != spec.size:
            pytest.skip(f"{spec.filename} is not assembled here (run tandem setup)")
        _assert_part_matches_gguf_py(path)
        tokens = read_part(path, long_arrays={"tokenizer.ggml.tokens"}).metadata["tokenizer.ggml.tokens"]
        assert len(tokens) == 151_936
