"""The llama.cpp peer's output parsers on real outputs of its binaries (saved from a build of
the llama.cpp vendored in llama-cpp-python 0.3.36, run on the default pair's GGUF files), and
scripts/peer_bench.py's answer when the binaries are missing."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench import llamacpp
from tests.paths import REPO_ROOT as ROOT

FIXTURES = Path(__file__).parent / "fixtures" / "llamacpp"


def test_reads_llama_bench_jsonl():
    (run,) = llamacpp.parse_bench_jsonl((FIXTURES / "llama-bench-tg96.jsonl").read_text())
    assert run.n_gen == 96 and run.threads == 2
    assert len(run.samples_tok_per_s) == 2
    assert run.tok_per_s == pytest.approx(sum(run.samples_tok_per_s) / 2, rel=1e-6)
    assert run.cpu_info.startswith("AMD EPYC")
    assert run.backends == "CPU"
    assert "Q4_K" in run.model_type


def test_reads_llama_speculative_simple_output():
    run = llamacpp.parse_speculative((FIXTURES / "llama-speculative-simple-n5.txt").read_text())
    assert run.draft_max == 5
    assert run.prompt_tokens == 36  # the chat-formatted fixture prompt, as Tandem's tokenizer counts it
    assert 0 < run.accepted <= run.drafted
    assert run.decoded_tokens > 0
    assert run.decode_tok_per_s == pytest.approx(run.decoded_tokens / run.decode_seconds, rel=0.01)


def test_reads_llama_cpp_system_info():
    info = llamacpp.parse_system_info((FIXTURES / "llama-system-info.txt").read_text())
    assert info["line"].startswith("system_info: n_threads = 2")
    assert {"AVX2", "AVX512_VNNI", "OPENMP"} <= set(info["features"])


def test_unreadable_outputs_are_refused_with_what_is_missing():
    with pytest.raises(llamacpp.PeerOutputError, match="no llama-bench result rows"):
        llamacpp.parse_bench_jsonl("| model | size |\n")
    text = (FIXTURES / "llama-speculative-simple-n5.txt").read_text()
    cut = "\n".join(line for line in text.splitlines() if "n_accept" not in line)
    with pytest.raises(llamacpp.PeerOutputError, match="lacks n_accept"):
        llamacpp.parse_speculative(cut)
    with pytest.raises(llamacpp.PeerOutputError, match="no system_info"):
        llamacpp.parse_system_info("main: build 1\n")


def test_finds_binaries_in_a_build_folder(tmp_path):
    (tmp_path / "bin").mkdir()
    for name in (llamacpp.BENCH_NAME, llamacpp.SPECULATIVE_NAME):
        (tmp_path / "bin" / name).write_bytes(b"")
    found = llamacpp.find_binaries(tmp_path)
    assert found.bench == tmp_path / "bin" / "llama-bench"
    assert found.speculative == tmp_path / "bin" / "llama-speculative-simple"
    (tmp_path / "bin" / llamacpp.SPECULATIVE_NAME).unlink()
    with pytest.raises(llamacpp.PeerMissing, match="llama-speculative-simple is not in"):
        llamacpp.find_binaries(tmp_path)


def test_script_without_binaries_exits_with_the_build_hint(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_BUILD"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "peer_bench.py"), "--llama-cpp", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 2
    assert "llama-bench is not in" in done.stderr
    assert "pip download --no-deps --no-binary :all: llama-cpp-python" in done.stderr
    assert "--target llama-bench llama-speculative-simple" in done.stderr
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "peer_bench.py")],
                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 2 and "no llama.cpp build folder given" in done.stderr


@pytest.mark.parametrize("flags, message", [
    (["--background-load", "-1"], "--background-load must be >= 0"),
    (["--memory-pressure", "-2"], "--memory-pressure must be >= 0"),
    (["--memory-left", "1", "--memory-pressure", "1"], "not beside --memory-pressure"),
])
def test_script_refuses_a_bad_load_before_looking_for_binaries(tmp_path, flags, message):
    """The same checks and words as `tandem bench` (the flags are declared once), and before the
    models load or llama.cpp is looked for."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "peer_bench.py"), "--llama-cpp", str(tmp_path), *flags],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and message in done.stderr and "llama-bench is not in" not in done.stderr
