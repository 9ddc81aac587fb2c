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


def test_reads_a_sampled_llama_speculative_simple_run():
    """Sampled at T=0.7 (seed 0), llama-speculative-simple prints the same lines: its figures read
    the same way."""
    run = llamacpp.parse_speculative((FIXTURES / "llama-speculative-simple-n5-t0.7-seed0.txt").read_text())
    assert run.draft_max == 5 and run.prompt_tokens == 36
    assert 0 < run.accepted <= run.drafted and run.decoded_tokens > 0


def test_sampled_speculation_samples_at_the_temperature_alone_with_the_seed():
    """llama.cpp's defaults cut the distribution (top-k 40, top-p 0.95, min-p 0.05) where Tandem's
    sampler does not: a sampled peer run turns every cut off, and takes the seed; greedy stays
    temperature 0 with no seed."""
    binaries = llamacpp.PeerBinaries(Path("/b/llama-bench"), Path("/b/llama-speculative-simple"))
    args = (binaries, Path("t.gguf"), Path("d.gguf"), "hi", 5, 96, 2)
    greedy = llamacpp.speculative_command(*args)
    sampled = llamacpp.speculative_command(*args, temperature=0.7, seed=3)

    def flags(command):
        return {command[i]: command[i + 1] for i in range(1, len(command) - 1) if command[i].startswith("-")}

    assert flags(greedy)["--temp"] == "0" and "--seed" not in greedy
    assert {k: flags(sampled)[k] for k in ("--temp", "--top-k", "--top-p", "--min-p", "--seed")} == {
        "--temp": "0.7", "--top-k": "0", "--top-p": "1.0", "--min-p": "0.0", "--seed": "3"}
    assert [c for c in sampled if not c.startswith("-")][:4] == [c for c in greedy if not c.startswith("-")][:4]


def test_the_peer_runs_each_seed_and_pools_them(tmp_path, monkeypatch):
    """scripts/peer_bench.py's Peer, sampled: one llama-speculative-simple run per seed at each
    --draft-max, the rate the geometric mean over seeds, acceptance pooled over every draft. The
    binary is a stand-in that prints a real sampled run's saved output for the seed it is given
    (no llama.cpp build here), and notes the flags it got."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import peer_bench
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    calls = tmp_path / "calls.txt"
    stand_in = tmp_path / "llama-speculative-simple"
    stand_in.write_text(f"""#!{sys.executable}
import sys
argv = sys.argv[1:]
with open({str(calls)!r}, "a") as f:
    f.write(" ".join(argv[argv.index("--temp"):]) + "\\n")
seed = argv[argv.index("--seed") + 1]
print(open({str(FIXTURES)!r} + f"/llama-speculative-simple-n5-t0.7-seed{{seed}}.txt").read())
""")
    stand_in.chmod(0o755)
    args = peer_bench.parse_args(["--llama-cpp", str(tmp_path), "--mode", "sample", "--seeds", "2", "--draft-max", "3", "5"])
    peer = peer_bench.Peer(llamacpp.PeerBinaries(tmp_path / "llama-bench", stand_in), Path("t.gguf"), Path("d.gguf"), args)
    rows = peer.speculative("prompt")
    seen = calls.read_text().splitlines()
    assert len(seen) == 4 and all("--temp 0.7 --top-k 0 --top-p 1.0 --min-p 0.0" in line for line in seen)
    assert [line.split("--seed ")[1].split()[0] for line in seen] == ["0", "1", "0", "1"]
    runs = [llamacpp.parse_speculative((FIXTURES / f"llama-speculative-simple-n5-t0.7-seed{s}.txt").read_text()) for s in (0, 1)]
    for n in ("3", "5"):
        row = rows[n]
        assert [s["seed"] for s in row["seeds"]] == [0, 1]
        assert row["decode_tok_per_s"] == pytest.approx((runs[0].decode_tok_per_s * runs[1].decode_tok_per_s) ** 0.5)
        assert row["drafted"] == runs[0].drafted + runs[1].drafted
        assert row["acceptance"] == pytest.approx((runs[0].accepted + runs[1].accepted) / (runs[0].drafted + runs[1].drafted))


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
    (["--mode", "sample", "--seeds", "0,0"], "--seeds must list distinct seeds"),
    (["--mode", "sample", "--temperature", "-1"], "temperature must be >= 0"),
])
def test_script_refuses_a_bad_load_before_looking_for_binaries(tmp_path, flags, message):
    """The same checks and words as `tandem bench` (the flags are declared once), and before the
    models load or llama.cpp is looked for."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "peer_bench.py"), "--llama-cpp", str(tmp_path), *flags],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and message in done.stderr and "llama-bench is not in" not in done.stderr
