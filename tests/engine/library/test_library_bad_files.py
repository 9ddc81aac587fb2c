"""A damaged GGUF file is one marked row, never the end of every listing: `tandem models` lists
the others and names the bad one with its reason, `tandem import` refuses it with the reason,
and a registered file that turns bad later is marked in the listing instead of failing it.
Run as a user runs them: the real CLI in a subprocess, on real tiny GGUF files."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from engine.library import import_model, list_local_models
from engine.library.fit_rows import local_fits
from engine.library.registry import registry_path
from engine.models.planning.hardware import Hardware

from .bad_ggufs import nested_arrays, zero_dims
from .cli_run import local_rows, profile, tandem
from .conftest import place_lmstudio, place_ollama

DAMAGES = ["nested_arrays", "zero_dims", "split_of_zero", "split_past_count"]


def _bad_file(kind: str, ggufs, folder):
    """A damaged file of ``kind`` in ``folder``; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "nested_arrays":
        return nested_arrays(folder / "nested.gguf")
    if kind == "zero_dims":
        return zero_dims(ggufs["target"], folder / "zero-dims.gguf")
    if kind == "split_of_zero":  # part 1 of a 0-part model
        return shutil.copy(ggufs["target"], folder / "model-00001-of-00000.gguf")
    return shutil.copy(ggufs["target"], folder / "model-00002-of-00001.gguf")  # part 2 of a 1-part model


def model_name_of(path) -> str:
    return f"someone/Bad-GGUF/{path.name.removesuffix('.gguf').split('-0000')[0]}"


def test_bad_files_in_a_discovered_folder_are_marked_rows(ggufs, isolated_home, tmp_path):
    good = place_lmstudio(isolated_home, ggufs["target"], "someone", "Tiny-GGUF")
    folder = isolated_home / ".lmstudio" / "models" / "someone" / "Bad-GGUF"
    bad = [_bad_file(kind, ggufs, folder) for kind in DAMAGES]

    rows = local_rows(tmp_path)
    assert rows[str(good)]["problem"] is None and rows[str(good)]["variant"] == "Q4_0"
    # The good file's drafting says nothing of the bad ones (they are no drafters, nor reasons).
    assert rows[str(good)]["drafting_reason"] == "no drafter is installed"
    for path in bad:
        row = rows[str(path)]
        assert row["problem"] and row["fit"] == "none" and not row["recommended"], row
        assert path.name in row["problem"] and "\n" not in row["problem"], row
    # The human table: the good file as before, each bad one on a marked line with its reason.
    run = tandem("models", "--precision", "file", "--hardware", profile(tmp_path))
    assert run.returncode == 0, run.stderr
    assert "   someone/Tiny-GGUF/tiny-target-Q4_0 " in run.stdout
    for path in bad:
        [line] = [line for line in run.stdout.splitlines() if f"problem: {path.name}" in line]
        assert model_name_of(path) in line, line
        assert line.startswith(" ! ") and "problem: " in line, line
    # The app's listing: every model, the bad ones with their problem; only the good one weighed.
    models = {m.path: m for m in list_local_models()}
    assert models[good].runnable and all(models[p].problem for p in bad)
    assert [f.model.path for f in local_fits(list(models.values()), Hardware.from_profile({"ram_gb": 16}))] == [good]


@pytest.mark.parametrize("damage", DAMAGES)
def test_import_refuses_a_bad_file_with_its_reason(ggufs, tmp_path, damage):
    path = _bad_file(damage, ggufs, tmp_path / "bad")
    run = tandem("import", str(path))
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1 and lines[0].startswith("tandem: error: ") and path.name in lines[0], run.stderr
    assert run.stdout == ""
    assert not registry_path().exists()  # nothing registered


def _turn(path, into) -> None:
    """Replace ``path``'s bytes with ``into``'s, its mtime moved on (as a rewrite leaves it)."""
    stat = path.stat()
    shutil.copy(into, path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))


@pytest.mark.parametrize("damage", ["nested_arrays", "zero_dims"])
def test_a_registered_file_that_turns_bad_is_marked(ggufs, tmp_path, damage):
    folder = tmp_path / "mine"
    folder.mkdir()
    kept = shutil.copy(ggufs["drafter"], folder / ggufs["drafter"].name)
    turning = shutil.copy(ggufs["target"], folder / "turning.gguf")
    import_model(kept)
    import_model(turning)
    _turn(turning, _bad_file(damage, ggufs, tmp_path / "bad"))

    rows = local_rows(tmp_path)
    assert rows[str(kept)]["problem"] is None and rows[str(turning)]["problem"], rows[str(turning)]
    assert [m["path"] for m in json.loads(registry_path().read_text())["models"]] == [str(kept), str(turning)]
    # Mended, it lists normally again.
    _turn(turning, ggufs["target"])
    assert local_rows(tmp_path)[str(turning)]["problem"] is None


def test_a_file_registered_before_it_was_checked_is_marked(ggufs, tmp_path):
    """A registry entry an earlier version wrote for a file it should have refused (a tensor of
    0 x 0, accepted before): its size and mtime still match the entry, so it is not read again
    as changed; the listing marks it instead of failing on it."""
    folder = tmp_path / "mine"
    folder.mkdir()
    kept = shutil.copy(ggufs["drafter"], folder / ggufs["drafter"].name)
    accepted = shutil.copy(ggufs["target"], folder / "accepted.gguf")
    import_model(kept)
    import_model(accepted)
    stat = accepted.stat()
    zero_dims(ggufs["target"], accepted)  # rewritten in place: the same size
    os.utime(accepted, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the mtime the entry has
    assert accepted.stat().st_size == stat.st_size

    rows = local_rows(tmp_path)
    assert rows[str(kept)]["problem"] is None
    assert rows[str(accepted)]["problem"] and rows[str(accepted)]["fit"] == "none", rows[str(accepted)]


def test_ollama_manifests_are_read_with_bounds(ggufs, tmp_path):
    """Beside a good model's manifest: one of 2 GiB (sparse), one linked to /dev/zero, a FIFO,
    one nested 100,000 deep. The listing skips each (a logged notice) without reading it whole,
    and lists the good one."""
    root = tmp_path / "ollama"
    blob = place_ollama(root, ggufs["drafter"], "tiny", tag="ok")
    manifests = root / "manifests" / "registry.ollama.ai" / "library" / "tiny"
    with open(manifests / "huge", "wb") as f:
        f.truncate(2 * 2**30)
    (manifests / "zero").symlink_to("/dev/zero")
    os.mkfifo(manifests / "fifo")
    (manifests / "deep").write_text("[" * 100_000 + "]" * 100_000)

    run = tandem("models", "--json", "--precision", "file", "--hardware", profile(tmp_path))
    assert run.returncode == 0, run.stderr
    local = [r for r in json.loads(run.stdout)["models"] if r["source"] == "ollama"]
    assert [(r["target_repo"], r["path"], r["problem"]) for r in local] == [("tiny:ok", str(blob), None)]
    assert run.peak_rss < 1.5 * 2**30, f"peak RSS {run.peak_rss / 2**30:.2f} GiB"
