"""`tandem models` run as a user runs it: a subprocess of this checkout's engine.cli."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models.planning.catalog import load_catalog
from tests.engine.models.planning.test_hardware import MACHINES
from tests.measured_run import run_measured
from tests.paths import REPO_ROOT as ROOT

FIELDS = {"id", "target_repo", "drafter_repo", "drafter_kind", "precision", "context", "estimate_bytes", "fit",
          "reason", "recommended", "predicted_speedup", "variant", "file_bytes", "source"}


def tandem_models(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "empty-hf-cache"))  # no cached configs leak in
    # --no-local: the catalog's rows only, whatever GGUF files this machine holds (the library's
    # tests cover those rows).
    return subprocess.run([sys.executable, "-m", "engine.cli", "models", "--no-local", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def profile(tmp_path, data) -> str:
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_json_for_a_described_gpu_desktop(tmp_path):
    out = tandem_models(tmp_path, "--json", "--hardware", profile(tmp_path, MACHINES["desktop-gpu-24"]))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["hardware"]["source"] == "profile"
    rows = report["models"]
    assert {r["id"] for r in rows} == {e.id for e in load_catalog(local_configs=False)}
    for row in rows:
        assert FIELDS <= set(row), row["id"]
        assert row["fit"] in {"gpu", "unified", "cpu", "tight", "none"}
        parts = row["estimate_bytes"]
        assert set(parts) >= {"weights", "kv_cache", "drafter", "overhead"} and all(v >= 0 for v in parts.values())
        low, high = row["predicted_speedup"]
        assert 1.0 <= low < high
    best = [r for r in rows if r["recommended"]]
    assert len(best) == 1 and best[0] is rows[0] and best[0]["fit"] == "gpu"
    by_id = {r["id"]: r for r in rows}
    assert by_id["glm-4.5-air"]["drafter_kind"] == "mtp" and by_id["glm-4.5-air"]["drafter_repo"] is None
    assert by_id["gemma-4-31b"]["drafter_repo"] == "google/gemma-4-31B-it-assistant"


def test_context_and_precision_options(tmp_path):
    out = tandem_models(tmp_path, "--json", "--context", "8192", "--precision", "fp32",
                        "--hardware", profile(tmp_path, MACHINES["cpu-32"]))
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["models"]
    assert {r["context"] for r in rows} == {8192} and {r["precision"] for r in rows} == {"fp32"}
    assert {r["fit"] for r in rows} <= {"cpu", "tight", "none"}


def test_json_rows_say_which_variant_runs_its_file_size_and_source(tmp_path):
    out = tandem_models(tmp_path, "--json", "--hardware", profile(tmp_path, {"ram_gb": 16, "cpu_cores": 8}))
    assert out.returncode == 0, out.stderr
    by_id = {r["id"]: r for r in json.loads(out.stdout)["models"]}
    catalog = {e.id: e for e in load_catalog(local_configs=False)}
    seven = by_id["qwen2.5-coder-7b"]
    assert (seven["variant"], seven["precision"], seven["source"]) == ("Q4_K_M", "file", "hub")
    assert seven["file_bytes"] == catalog["qwen2.5-coder-7b"].variants[0].file_bytes
    assert seven["gguf"]["repo"] == "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF"
    assert seven["drafter_gguf"]["files"] == ["Qwen2.5-Coder-0.5B-Instruct-Q8_0.gguf"]
    gemma = by_id["gemma-4-e4b"]  # no GGUF build Tandem runs: safetensors, its bf16 download
    assert gemma["variant"] == "safetensors" and gemma["gguf"] is None
    assert gemma["file_bytes"] == catalog["gemma-4-e4b"].weight_bytes("bf16")
    assert by_id["default-offline"]["source"] == "pypi"
    # --precision file: only the GGUF files (models without one still listed, as safetensors).
    out = tandem_models(tmp_path, "--json", "--precision", "file", "--hardware", profile(tmp_path, {"ram_gb": 16}))
    rows = json.loads(out.stdout)["models"]
    assert {r["variant"] for r in rows if catalog[r["id"]].variants} <= {"Q4_K_M", "Q5_K_M", "Q8_0", "Q5_0"}


def test_human_table(tmp_path):
    out = tandem_models(tmp_path, "--precision", "bf16", "--hardware", profile(tmp_path, MACHINES["apple-8"]))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "unified memory 8.0 GB" in lines[0]
    assert any(line.startswith("*  smollm2-1.7b") for line in lines)
    assert "recommended: SmolLM2 1.7B with HuggingFaceTB/SmolLM2-135M-Instruct" in out.stdout
    for e in load_catalog(local_configs=False):
        assert e.id in out.stdout
    laptop = tandem_models(tmp_path, "--hardware", profile(tmp_path, {"ram_gb": 16, "cpu_cores": 8}))
    assert laptop.returncode == 0, laptop.stderr
    seven = next(line for line in laptop.stdout.splitlines() if "qwen2.5-coder-7b " in line)
    assert "Q4_K_M" in seven and "4.7 GB" in seven  # its file: 4.68e9 bytes
    assert "recommended:" in laptop.stdout and "-GGUF Q4_K_M" in laptop.stdout


@pytest.mark.parametrize("data, words", [({"ram_gb": "lots"}, "'ram_gb' must be a number"),
                                         ({"gpus": [{"vram_gb": 8}]}, "missing 'ram_gb'")])
def test_malformed_profile_is_a_readable_error(tmp_path, data, words):
    out = tandem_models(tmp_path, "--hardware", profile(tmp_path, data))
    assert out.returncode == 1
    assert out.stderr.startswith("tandem: error:") and words in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_profile_file(tmp_path):
    out = tandem_models(tmp_path, "--hardware", str(tmp_path / "nope.json"))
    assert out.returncode == 1 and "cannot read hardware profile" in out.stderr


def test_this_machine(tmp_path):
    out = tandem_models(tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["hardware"]["source"] == "detected" and report["hardware"]["ram_total"] > 0
    assert len(report["models"]) == len(load_catalog(local_configs=False))



def test_models_names_the_default_pairs_precisions_as_the_picker_does(tmp_path):
    out = tandem_models(tmp_path, "--hardware", profile(tmp_path, {"ram_gb": 16, "cpu_cores": 8}))
    assert out.returncode == 0, out.stderr
    # This test's cache holds no converted pair: from a GGUF file whose type is not read yet.
    assert ("default-offline precision: As in the file (--precision file, the default); also bf16 (dequantized),"
            " fp32 (exact, dequantized), int8 (re-quantized), int4 (re-quantized)") in out.stdout


def _run_bounded(args: list[str], timeout: float = 90) -> tuple[int, str, int]:
    """(exit status, stderr, peak RSS in bytes) of ``tandem models ARGS`` run as a user runs it,
    its address space capped at 6 GiB so that a read without bound fails instead of filling
    this machine's memory; pytest.fail where it is still running after ``timeout`` s."""
    run = run_measured([sys.executable, "-m", "engine.cli", "models", "--no-local", *args], cwd=ROOT,
                       timeout=timeout, address_cap=6 * 2**30)
    return run.returncode, run.stderr, run.peak_rss


@pytest.mark.parametrize("kind, words", [("dev-zero", "is not a regular file"), ("fifo", "is not a regular file"),
                                         ("huge", "more than the 1 MiB it may be"),
                                         ("deep", "nests more than 16 levels deep")])
def test_a_profile_that_is_no_profile_is_refused_before_it_is_read(tmp_path, kind, words):
    """--hardware names a device, a FIFO, a 5 GB file or brackets nested 100,000 deep: refused with
    one line, at once and without reading it (before: /dev/zero read until memory ran out, a FIFO
    waited for a writer forever, the 5 GB file was read whole, the nesting ended in a
    RecursionError's message)."""
    if kind == "dev-zero":
        path = "/dev/zero"
    elif kind == "fifo":
        path = str(tmp_path / "machine.json")
        os.mkfifo(path)
    elif kind == "huge":
        path = str(tmp_path / "machine.json")
        with open(path, "wb") as f:
            f.truncate(5 * 10**9)  # sparse: no disk is used
    else:
        path = str(tmp_path / "machine.json")
        Path(path).write_text("[" * 100_000 + "]" * 100_000)
    status, err, peak = _run_bounded(["--hardware", path])
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == 1 and lines[0].startswith("tandem: error:"), err
    assert words in lines[0] and path in lines[0], err
    assert peak < 2 * 2**30, f"peak RSS {peak / 2**30:.1f} GiB"
