"""The library's one-pass header reader agrees with gguf-py's reader (through engine.gguf.reader)
on metadata, tensor table and vocabulary, and refuses damaged files as that reader does."""
from __future__ import annotations

import pytest

from engine.gguf.reader import GgufError, LongArray, open_gguf
from engine.library import vocab
from engine.library.header import read_header


@pytest.mark.parametrize("which", ["target", "split", "mamba"])
def test_header_matches_gguf_py(ggufs, which):
    from gguf import GGUFReader

    header, file = read_header(ggufs[which]), open_gguf(ggufs[which])
    assert header.paths == file.paths
    assert {k: (t.type_name, t.shape, t.nbytes) for k, t in header.tensors.items()} == \
           {k: (t.type_name, t.shape, t.nbytes) for k, t in file.tensors.items()}
    scalars = {k: v for k, v in file.metadata.items() if not isinstance(v, LongArray) and not k.startswith("GGUF.")}
    assert {k: header.metadata[k] for k in scalars if k != "tokenizer.ggml.tokens"} == \
           {k: v for k, v in scalars.items() if k != "tokenizer.ggml.tokens"}
    field = GGUFReader(file.path).fields["tokenizer.ggml.tokens"]
    assert header.tokens == [bytes(field.parts[i]).decode() for i in field.data]
    assert header.parameter_count == sum(_elements(t.shape) for t in file.tensors.values())


def _elements(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_damaged_files_are_refused_naming_the_file(ggufs, tmp_path):
    data = ggufs["target"].read_bytes()
    cases = {"half.gguf": (data[: len(data) // 2], r"half\.gguf is truncated"),
             "header-cut.gguf": (data[:200], r"header-cut\.gguf is truncated or corrupted"),
             "magic.gguf": (b"GGML" + data[4:], r"magic\.gguf is not a GGUF file \(bad magic"),
             "tiny.gguf": (b"GGUF", r"tiny\.gguf is not a GGUF file: it is only 4 bytes long")}
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(GgufError, match=message):
            read_header(tmp_path / name)
        with pytest.raises(GgufError):  # engine.gguf's own reader refuses it too
            open_gguf(tmp_path / name)


def test_fingerprint_is_the_token_list():
    assert vocab.fingerprint(["a", "b"]) == vocab.fingerprint(["a", "b"])
    assert vocab.fingerprint(["a", "b"]) != vocab.fingerprint(["b", "a"])
    assert vocab.fingerprint(["ab", "c"]) != vocab.fingerprint(["a", "bc"])  # lengths are part of it
    diff = vocab.first_difference(["a", "b", "c"], ["a", "x", "c"])
    assert (diff.token_id, diff.ours, diff.theirs) == (1, "b", "x")
    assert vocab.first_difference(["a", "b"], ["a"]).token_id == 1
    assert vocab.first_difference(["a"], ["a"]) is None
