"""Assembling and verifying GGUF chunks: a bad file is an error and is never used."""
import hashlib

import pytest

from engine.models.loading.default_pair import GgufSpec, ModelIntegrityError, ModelNotInstalled, assemble, part_paths


def make_parts(tmp_path, chunks):
    paths = []
    for i, data in enumerate(chunks):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(data)
        paths.append(p)
    return paths


def spec_for(data: bytes) -> GgufSpec:
    return GgufSpec("toy", "toy.gguf", (), hashlib.sha256(data).hexdigest(), len(data))


def test_parts_are_concatenated_in_order_and_verified(tmp_path):
    chunks = [b"GGUF" + bytes(range(256)) * 50, b"middle" * 1000, b"end"]
    spec = spec_for(b"".join(chunks))
    seen = []
    path = assemble(spec, make_parts(tmp_path, chunks), tmp_path / "out", lambda s, d, t: seen.append((s, d, t)))
    assert path.read_bytes() == b"".join(chunks)
    assert seen[-1][1] == seen[-1][2] == spec.size  # progress reached 100%
    assert assemble(spec, [], tmp_path / "out") == path  # second call trusts the verified file


def test_corrupted_chunk_is_refused_and_nothing_is_left_looking_complete(tmp_path):
    chunks = [b"a" * 5000, b"b" * 5000]
    spec = spec_for(b"".join(chunks))
    bad = make_parts(tmp_path, [b"a" * 5000, b"b" * 4999 + b"X"])
    with pytest.raises(ModelIntegrityError, match="corrupted"):
        assemble(spec, bad, tmp_path / "out")
    assert not (tmp_path / "out" / "toy.gguf").exists()
    assert (tmp_path / "out" / "toy.partial.corrupt").exists()


def test_file_corrupted_after_install_is_detected_and_rebuilt(tmp_path):
    chunks = [b"x" * 3000, b"y" * 3000]
    spec = spec_for(b"".join(chunks))
    parts = make_parts(tmp_path, chunks)
    path = assemble(spec, parts, tmp_path / "out")
    with open(path, "r+b") as f:  # flip a byte, as a disk error or a bad copy would
        f.seek(100)
        f.write(b"Z")
    with pytest.raises(ModelIntegrityError):
        assemble(spec, parts, tmp_path / "out")
    assert not path.exists()
    assert assemble(spec, parts, tmp_path / "out").read_bytes() == b"".join(chunks)


def test_missing_package_says_how_to_install():
    spec = GgufSpec("ghost", "ghost.gguf", ("no_such_module_part1",), "0" * 64, 1)
    with pytest.raises(ModelNotInstalled, match="set-up"):
        part_paths(spec)


@pytest.fixture
def tiny_default_pair(tmp_path, monkeypatch):
    """The default pair's target and drafter replaced by one tiny Q8_0 GGUF file, already
    assembled in the cache (so no part packages are needed)."""
    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    tokenizer = build_tokenizer()
    made = write_gguf(build_model("qwen2", len(tokenizer), init=0.1), tokenizer, tmp_path / "tiny.gguf", "Q8_0")
    spec = spec_for(made.read_bytes())
    assemble(spec, [made], cache_dir() / "gguf")
    monkeypatch.setattr(default_pair, "TARGET", spec)
    monkeypatch.setattr(default_pair, "DRAFTER", spec)
    return spec


def test_the_default_pair_runs_from_its_gguf_file_at_file_and_from_its_folder_otherwise(tiny_default_pair, tmp_path):
    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair

    gguf, folder = cache_dir() / "gguf" / "toy.gguf", cache_dir() / "models" / "toy"
    assert default_pair.DEFAULT_PRECISION == "file"
    assert default_pair.prepare_pair("file") == (gguf, folder)  # the drafter: its converted folder
    assert default_pair.prepare_pair(None) == (gguf, folder)
    assert default_pair.prepare_pair("int8", need_drafter=False) == (folder, None)
    assert default_pair.is_default_target(gguf) and default_pair.is_default_target(str(folder))
    assert not default_pair.is_default_target(tmp_path / "tiny.gguf")


def test_the_cli_loads_the_default_pair_at_its_default_precision_and_others_on_request(tiny_default_pair, capsys):
    from engine.cli import main

    assert main(["compare", "def add(a, b):", "--max-new-tokens", "4", "--drafter-head", "full"]) == 0
    err = capsys.readouterr().err
    assert "loading toy.gguf + toy (file: As in the file (Q8_0))" in err
    assert main(["compare", "def add(a, b):", "--max-new-tokens", "4", "--drafter-head", "full", "--precision", "int8"]) == 0
    assert "loading toy + toy (int8: int8 (re-quantized from Q8_0))" in capsys.readouterr().err
