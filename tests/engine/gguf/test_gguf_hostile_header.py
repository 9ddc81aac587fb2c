"""A GGUF header's numbers are held to the tensors the file holds, before anything is built.

Each file here is a real tiny GGUF (two layers, width 64, 4 heads of 16, 2 KV heads, a
byte-level BPE vocabulary of 387 tokens: what its trainer makes of the corpus)
with one metadata value overwritten in place, as a corrupted or hostile
download would have it. Every one must be refused with one line naming the file and the key:
by the loader (open_gguf, load_gguf), by the model library's header reader and the picker's
memory facts (engine.library), and from a header-cache entry kept from before the checks.
"""
from __future__ import annotations

import math
import shutil
import struct
from pathlib import Path

import pytest

from engine.core.paths import cache_dir
from engine.gguf.header import GgufError, read_part
from engine.testing.tiny_gguf import build_model, write_gguf
from engine.testing.tiny_models import build_tokenizer

# (key, value written over it, what the message must say)
HOSTILE = {
    "20k-layers": ("qwen2.block_count", 20_000, "says 20,000 layers, but the file holds tensors for 2"),
    "1m-layers": ("qwen2.block_count", 1_000_000, "says 1,000,000 layers, but the file holds tensors for 2"),
    "fewer-layers": ("qwen2.block_count", 1, "says 1 layers, but the file holds tensors for 2"),
    "nan-rope": ("qwen2.rope.freq_base", math.nan, "is nan, not a finite number"),
    "inf-eps": ("qwen2.attention.layer_norm_rms_epsilon", math.inf, "is inf, not a finite number"),
    "negative-rope": ("qwen2.rope.freq_base", -10000.0, "must be above 0"),
    "eos-out-of-vocab": ("tokenizer.ggml.eos_token_id", 100_000, "is 100,000, outside the vocabulary of 387 tokens"),
    "bos-out-of-vocab": ("tokenizer.ggml.bos_token_id", 387, "is 387, outside the vocabulary of 387 tokens"),
    "pad-out-of-vocab": ("tokenizer.ggml.padding_token_id", 2**32 - 1, "is 4,294,967,295, outside the vocabulary"),
    "no-heads": ("qwen2.attention.head_count", 0, "is 0; it must be from 1 to"),
    "wrong-heads": ("qwen2.attention.head_count", 3, "does not match blk.0.attn_q.weight"),
    "kv-heads-not-dividing": ("qwen2.attention.head_count_kv", 3, "does not divide the 4 attention heads"),
    "huge-width": ("qwen2.embedding_length", 2**20, "is 1,048,576; it must be from 1 to 131,072"),
    "wrong-width": ("qwen2.embedding_length", 128, "is 128, but token_embd.weight holds rows of 64"),
    "wrong-ffn": ("qwen2.feed_forward_length", 96, "does not match blk.0.ffn_up.weight"),
    "no-context": ("qwen2.context_length", 0, "is 0; it must be from 1 to"),
}


_USER_CACHE = cache_dir()  # the real one, read before own_cache points TANDEM_HOME elsewhere


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    tokenizer = build_tokenizer()
    return write_gguf(build_model("qwen2", len(tokenizer)), tokenizer,
                      tmp_path_factory.mktemp("hostile-header") / "good.gguf", "Q8_0")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))


def overwrite(source: Path, dest: Path, key: str, value) -> Path:
    """A copy of ``source`` with metadata ``key``'s scalar replaced by ``value`` (packed in the
    key's own value type, so nothing else in the file moves)."""
    from gguf import GGUFValueType

    formats = {GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.UINT64: "<Q",
               GGUFValueType.INT64: "<q", GGUFValueType.FLOAT32: "<f", GGUFValueType.FLOAT64: "<d"}
    data = bytearray(source.read_bytes())
    encoded = struct.pack("<Q", len(key)) + key.encode()
    at = data.index(encoded) + len(encoded)
    fmt = formats[GGUFValueType(struct.unpack_from("<I", data, at)[0])]
    struct.pack_into(fmt, data, at + 4, value)
    dest.write_bytes(bytes(data))
    return dest


@pytest.fixture(params=sorted(HOSTILE))
def hostile(request, good, tmp_path) -> tuple[Path, str, str]:
    key, value, says = HOSTILE[request.param]
    return overwrite(good, tmp_path / f"{request.param}.gguf", key, value), key, says


def _assert_names_file_and_key(exc: pytest.ExceptionInfo, path: Path, key: str, says: str) -> None:
    message = str(exc.value)
    assert message.startswith(f"{path.name}: metadata '{key}' "), message
    assert says in message and "\n" not in message, message


def test_the_file_as_written_passes(good):
    from engine.gguf.header import read_split

    assert read_split(good)[0].metadata["qwen2.block_count"] == 2


def test_the_loader_refuses_naming_the_file_and_the_key(hostile):
    from engine.gguf.loader import load_gguf
    from engine.gguf.reader import open_gguf

    path, key, says = hostile
    with pytest.raises(GgufError) as exc:
        open_gguf(path)
    _assert_names_file_and_key(exc, path, key, says)
    with pytest.raises(GgufError) as exc:
        load_gguf(path)
    _assert_names_file_and_key(exc, path, key, says)


def test_listings_and_the_picker_refuse_it_with_the_same_message(hostile):
    """engine.library reads headers through engine.gguf.header: the same check, the same line
    (a listing shows it as the model's problem; the picker no longer budgets 20,000 layers)."""
    from engine.library.fit_rows import architecture_from_header
    from engine.library.header import read_header

    path, key, says = hostile
    with pytest.raises(GgufError) as exc:
        read_header(path)
    _assert_names_file_and_key(exc, path, key, says)
    with pytest.raises(GgufError) as exc:
        architecture_from_header(path)
    _assert_names_file_and_key(exc, path, key, says)


def test_the_default_pairs_files_pass():
    """The real files the app ships with (where this machine has them assembled)."""
    from engine.gguf.header import read_split
    from engine.models.loading.default_pair import DRAFTER, TARGET

    paths = [p for spec in (TARGET, DRAFTER) if (p := _USER_CACHE / "gguf" / spec.filename).exists()]
    if not paths:
        pytest.skip("the default pair's GGUF files are not assembled here")
    for path in paths:
        assert read_split(path)[0].metadata["qwen2.block_count"] in (24, 28)


def test_a_header_cache_entry_from_before_the_checks_is_checked(hostile):
    """An entry engine.gguf.metadata_cache wrote for the file when it was not yet checked (its
    header bytes unchanged, so the entry is current) is refused as the file itself is."""
    from engine.gguf import metadata_cache
    from engine.gguf.reader import from_table

    path, key, says = hostile
    part = read_part(path)  # one part's parse: the checks run on whole models (read_split)
    table = [{"name": t.name, "type": t.type_name, "shape": list(t.shape), "part": 0, "offset": t.offset,
              "nbytes": t.nbytes} for t in part.tensors]
    unchecked = from_table((path,), part.metadata, table, (part.data_offset,))
    metadata_cache._write_entry(metadata_cache.entry_dir(path), unchecked)
    with pytest.raises(GgufError) as exc:
        metadata_cache.open_cached(path)
    _assert_names_file_and_key(exc, path, key, says)


def test_a_split_model_is_checked_across_its_parts(tmp_path):
    """block_count against the layers of every part (the first part alone holds fewer)."""
    from engine.gguf.reader import open_gguf

    tokenizer = build_tokenizer()
    first = write_gguf(build_model("qwen2", len(tokenizer)), tokenizer, tmp_path / "split.gguf", "Q8_0",
                       split_max_tensors=8)
    assert len(open_gguf(first).tensors) > 8  # opens: every part's layers count
    parts = sorted(tmp_path.glob("split-*.gguf"))
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    for p in parts[1:]:
        shutil.copy(p, hostile / p.name)
    overwrite(parts[0], hostile / parts[0].name, "qwen2.block_count", 3)
    with pytest.raises(GgufError, match=r"^split-00001-of-\d+\.gguf: metadata 'qwen2.block_count' says 3 layers"):
        open_gguf(hostile / parts[-1].name)


def test_architectures_without_attention_may_state_zero_heads(good, tmp_path):
    """Mamba and RWKV files write head_count 0 (they have no attention); a listing must still
    read them (and say the architecture is not one Tandem runs), not call them corrupted."""
    from engine.gguf.header_checks import check_header

    metadata = {"general.architecture": "mamba", "mamba.block_count": 1, "mamba.embedding_length": 64,
                "mamba.context_length": 1_048_576, "mamba.attention.head_count": 0,
                "mamba.attention.head_count_kv": 0, "mamba.feed_forward_length": 0}
    check_header("mamba.gguf", metadata, {"token_embd.weight": (512, 64), "blk.0.ssm_in.weight": (256, 64)})
