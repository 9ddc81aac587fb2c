"""`tandem import PATH`: a GGUF file registered where it lies, refused with one line when it
cannot be used, kept in step with the disk, and never half-written."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from engine.cli import main as cli_main
from engine.library import import_model, list_local_models, store
from engine.library.registry import registry_path


def _copy(ggufs, which, folder):
    folder.mkdir(parents=True, exist_ok=True)
    return shutil.copy(ggufs[which], folder / ggufs[which].name)


def test_import_registers_in_place_and_is_idempotent(ggufs, tmp_path, capsys):
    path = _copy(ggufs, "target", tmp_path / "mine")
    assert cli_main(["import", str(path)]) == 0
    out = capsys.readouterr().out
    assert "registered tiny-target-Q4_0: qwen2, Q4_0" in out and "drafter: prompt lookup (no drafter is installed)" in out
    assert cli_main(["import", str(path)]) == 0
    registry = json.loads(registry_path().read_text())
    assert [m["path"] for m in registry["models"]] == [str(path)]  # once, however often imported
    entry = registry["models"][0]
    assert entry["stamps"] == [[str(path), path.stat().st_size, path.stat().st_mtime_ns]]
    summary = entry["summary"]
    assert summary["architecture"] == "qwen2" and summary["quant"] == "Q4_0" and summary["vocab_size"] == 387  # the tiny tokenizer's BPE
    assert summary["context_length"] == 512 and summary["parameter_count"] > 0
    assert summary["vocab_fingerprint"].startswith("vocab-")
    assert list(tmp_path.joinpath("mine").iterdir()) == [path]  # nothing copied or written beside it
    [model] = list_local_models()
    assert (model.source, model.path, model.quant, model.file_bytes) == ("imported", path, "Q4_0", path.stat().st_size)


def test_split_model_imports_as_one(ggufs, tmp_path):
    parts = sorted(ggufs["split"].parent.glob("*.gguf"))
    assert len(parts) == 3
    model = import_model(parts[1])  # any part names the set
    assert model.parts == tuple(parts) and model.name == "tiny-split-Q8_0"
    assert model.file_bytes == sum(p.stat().st_size for p in parts)


@pytest.mark.parametrize("damage", ["truncated", "not_gguf", "missing_part", "unsupported_arch", "folder"])
def test_import_refuses_with_one_line(ggufs, tmp_path, capsys, damage):
    folder = tmp_path / "bad"
    folder.mkdir()
    if damage == "truncated":
        path, reason = folder / "cut.gguf", "cut.gguf is truncated"
        path.write_bytes(ggufs["target"].read_bytes()[:5000])
    elif damage == "not_gguf":
        path, reason = folder / "notes.gguf", "notes.gguf is not a GGUF file (bad magic"
        path.write_text("these are not weights, just some text long enough to have a magic number\n")
    elif damage == "missing_part":
        for p in ggufs["split"].parent.glob("*.gguf"):
            shutil.copy(p, folder / p.name)
        (folder / "tiny-split-Q8_0-00002-of-00003.gguf").unlink()
        path, reason = folder / "tiny-split-Q8_0-00001-of-00003.gguf", "tiny-split-Q8_0-00002-of-00003.gguf is missing"
    elif damage == "unsupported_arch":
        path, reason = _copy(ggufs, "mamba", folder), "tiny-mamba-Q8_0.gguf is a 'mamba' model"
    else:
        path, reason = folder, "is a folder"
    assert cli_main(["import", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tandem: error: ") and reason in lines[0], captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert not registry_path().exists()  # nothing registered


def test_changed_file_is_read_again_and_vanished_one_marked(ggufs, tmp_path):
    kept = _copy(ggufs, "target", tmp_path / "a")
    changing = _copy(ggufs, "target", tmp_path / "b")
    vanishing = _copy(ggufs, "drafter", tmp_path / "c")
    for path in (kept, changing, vanishing):
        import_model(path)
    shutil.copy(ggufs["other_vocab"], changing)  # another model under the same name
    stat = changing.stat()
    os.utime(changing, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    vanishing.unlink()
    models = {m.path: m for m in list_local_models()}
    assert set(models) == {kept, changing, vanishing}
    assert models[changing].summary.vocab_size == 300 and models[changing].quant == "Q8_0"
    # Gone (a drive not mounted, a file moved): listed as missing, still registered.
    assert not models[vanishing].runnable and models[vanishing].drafting is None
    assert models[vanishing].problem.startswith(f"{vanishing} is missing") and "--forget" in models[vanishing].problem
    registry = json.loads(registry_path().read_text())
    assert [m["path"] for m in registry["models"]] == [str(kept), str(changing), str(vanishing)]
    assert registry["models"][1]["summary"]["vocab_size"] == 300
    changing.write_bytes(changing.read_bytes()[:3000])  # now damaged: marked, kept, not re-registered as it is
    models = {m.path: m for m in list_local_models()}
    assert models[kept].runnable
    assert models[changing].problem.startswith("tiny-target-Q4_0.gguf is truncated")
    after = json.loads(registry_path().read_text())["models"]
    assert after == registry["models"]  # the entry as it was last read well
    shutil.copy(ggufs["drafter"], vanishing)  # back
    assert {m.path: m for m in list_local_models()}[vanishing].runnable


def test_a_write_that_fails_midway_leaves_the_old_registry(ggufs, tmp_path, monkeypatch):
    first = _copy(ggufs, "target", tmp_path / "a")
    import_model(first)
    before = registry_path().read_bytes()

    def fail(*args):
        raise OSError(28, "No space left on device")

    second = _copy(ggufs, "drafter", tmp_path / "b")
    with monkeypatch.context() as patched:
        patched.setattr(store.os, "replace", fail)
        with pytest.raises(OSError, match="No space left"):
            import_model(second)
    assert registry_path().read_bytes() == before
    assert sorted(p.name for p in registry_path().parent.iterdir() if "library" in p.name) == ["library.json",
                                                                                               "library.json.lock"]
    assert [m.path for m in list_local_models()] == [first]


def test_a_process_killed_midway_leaves_the_old_registry(ggufs, tmp_path):
    first = _copy(ggufs, "target", tmp_path / "a")
    import_model(first)
    before = registry_path().read_bytes()
    second = _copy(ggufs, "drafter", tmp_path / "b")
    # The new registry is fully written to its temporary file when the process is killed
    # (SIGKILL: no handler, no cleanup), right before the rename.
    script = ("import os, signal\n"
              "from engine.library import store\n"
              "replace = os.replace\n"
              "def killed(src, dst):\n"
              "    if str(dst).endswith('library.json'):\n"
              "        os.kill(os.getpid(), signal.SIGKILL)\n"
              "    replace(src, dst)\n"
              "store.os.replace = killed\n"
              "from engine.library import import_model\n"
              f"import_model({str(second)!r})\n")
    done = subprocess.run([sys.executable, "-c", script], check=False, env=os.environ.copy(), capture_output=True, timeout=60)
    assert done.returncode == -9, done.stderr.decode()
    assert registry_path().read_bytes() == before
    assert [m.path for m in list_local_models()] == [first]
    [left] = [p for p in registry_path().parent.iterdir() if p.name.endswith(".tmp")]  # the dead writer's
    assert [m["path"] for m in json.loads(left.read_text())["models"]] == [str(first), str(second)]
    os.utime(left, (left.stat().st_atime - 60, left.stat().st_mtime - 60))
    import_model(second)  # and the next write goes through, clearing the abandoned temporary
    assert [m.path for m in list_local_models()] == [first, second]
    assert not left.exists()


def test_import_says_which_drafter_it_found(ggufs, tmp_path, capsys):
    import_model(_copy(ggufs, "drafter", tmp_path / "d"))
    assert cli_main(["import", str(_copy(ggufs, "target", tmp_path / "t"))]) == 0
    out = capsys.readouterr().out
    assert "  drafter: tiny-drafter-Q8_0 (imported; tiny-drafter-Q8_0 shares the vocabulary and is " in out
    assert cli_main(["import", "--forget", str(tmp_path / "t" / ggufs["target"].name)]) == 0
    assert [m.name for m in list_local_models()] == ["tiny-drafter-Q8_0"]
    assert (tmp_path / "t" / ggufs["target"].name).exists()  # forgotten, not deleted
