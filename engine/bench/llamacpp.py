"""llama.cpp as a benchmark peer: run its ``llama-bench`` and ``llama-speculative-simple``
binaries on a GGUF file and read the figures they print.

llama.cpp is a yardstick, never a dependency: it is built apart (``BUILD_HINT``), found by the
folder it was built in, and run as a subprocess. Nothing in the product imports this module
(an import-linter contract in pyproject.toml keeps it so); scripts/peer_bench.py drives it.

    binaries = find_binaries(Path("/tmp/peer/build"))     # PeerMissing (with BUILD_HINT) if absent
    plain = run_plain(binaries, target, n_gen=96, threads=2)          # llama-bench tg rate
    spec = run_speculative(binaries, target, drafter, prompt, draft_max=5, n_predict=96, threads=2)
    sampled = run_speculative(..., temperature=0.7, seed=0)          # pure temperature sampling
    system = run_system_info(binaries, threads=2)   # its "system_info:" line (CPU features)

The parsers (``parse_bench_jsonl``, ``parse_speculative``, ``parse_system_info``) take the text
the binaries print, so a test reads a saved real output without running them.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BUILD_HINT = """llama.cpp's llama-bench and llama-speculative-simple are needed (a benchmark peer, never a dependency). Build them outside the repository:
    mkdir -p /tmp/peer && cd /tmp/peer
    pip download --no-deps --no-binary :all: llama-cpp-python
    tar xzf llama_cpp_python-*.tar.gz && cd llama_cpp_python-*/
    cmake -B /tmp/peer/build vendor/llama.cpp -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    nice -n 10 cmake --build /tmp/peer/build -j2 --target llama-bench llama-speculative-simple   # ~15 min on 2 cores
then pass --llama-cpp /tmp/peer/build"""

# llama.cpp's threads spin-wait between operations (its OpenMP build): on a shared machine whose
# cores are oversubscribed, 2 threads then fall to ~1 tok/s (measured: 1.1 vs 8.2 tok/s with
# passive waiting, the same run). Passive waiting is its best setting there, so the peer runs so
# unless told otherwise (scripts/peer_bench.py --omp-wait-policy sets it for both engines).
PEER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}

BENCH_NAME = "llama-bench"
SPECULATIVE_NAME = "llama-speculative-simple"


class PeerMissing(RuntimeError):
    """The llama.cpp binaries are not where we were told to look; the message says how to build them."""


class PeerOutputError(RuntimeError):
    """A llama.cpp binary printed something we cannot read figures from (or failed)."""


@dataclass(frozen=True)
class PeerBinaries:
    bench: Path
    speculative: Path


@dataclass(frozen=True)
class PlainRun:
    """llama-bench's token-generation test (``-p 0 -n N``): decode from an empty context."""

    n_gen: int
    threads: int
    tok_per_s: float          # llama-bench's avg_ts over its repetitions
    stddev_tok_per_s: float
    samples_tok_per_s: tuple[float, ...]
    cpu_info: str
    backends: str
    build_commit: str
    build_number: int
    model_type: str


@dataclass(frozen=True)
class SpeculativeRun:
    """One llama-speculative-simple run: its own printed timings and draft counters."""

    draft_max: int
    prompt_tokens: int
    prompt_seconds: float
    decoded_tokens: int       # its n_predict: generated tokens, an end-of-generation token included
    decode_seconds: float     # from the first decode pass to the last, the prompt's prefill excluded
    decode_tok_per_s: float
    drafted: int
    accepted: int

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def find_binaries(build_dir: Path | str | None) -> PeerBinaries:
    """The two binaries under a llama.cpp build folder (``bin/`` or the folder itself)."""
    if build_dir is None:
        raise PeerMissing(f"no llama.cpp build folder given.\n{BUILD_HINT}")
    build_dir = Path(build_dir).expanduser()
    found = {}
    for name in (BENCH_NAME, SPECULATIVE_NAME):
        candidates = [build_dir / "bin" / name, build_dir / name]
        hit = next((c for c in candidates if c.is_file()), None)
        if hit is None:
            raise PeerMissing(f"{name} is not in {build_dir} (looked in {', '.join(str(c.parent) for c in candidates)}).\n{BUILD_HINT}")
        found[name] = hit
    return PeerBinaries(bench=found[BENCH_NAME], speculative=found[SPECULATIVE_NAME])


def parse_bench_jsonl(text: str) -> list[PlainRun]:
    """Every test row of ``llama-bench -o jsonl`` output (one JSON object a line; other lines,
    e.g. a warning, are skipped)."""
    runs = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if "avg_ts" not in row:
            continue
        runs.append(PlainRun(n_gen=int(row["n_gen"]), threads=int(row["n_threads"]), tok_per_s=float(row["avg_ts"]),
                             stddev_tok_per_s=float(row["stddev_ts"]),
                             samples_tok_per_s=tuple(float(v) for v in row.get("samples_ts", ())),
                             cpu_info=str(row.get("cpu_info", "")), backends=str(row.get("backends", "")),
                             build_commit=str(row.get("build_commit", "")), build_number=int(row.get("build_number", 0)),
                             model_type=str(row.get("model_type", ""))))
    if not runs:
        raise PeerOutputError(f"no llama-bench result rows in its output:\n{text[-2000:]}")
    return runs


_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
# Its log lines may carry a time stamp and level ("0.25.394.562 I n_draft   = 5").
_COUNTER = re.compile(r"^.*?\b(n_draft|n_drafted|n_accept)\s+=\s+(\d+)\s*$", re.MULTILINE)


def parse_speculative(text: str) -> SpeculativeRun:
    """The figures of one llama-speculative-simple run from its output (stdout and stderr together):
    its ``encoded ... / decoded ... tokens in ... seconds, speed: ... t/s`` lines and the
    ``n_draft / n_drafted / n_accept`` counters."""
    encoded, decoded = _ENCODED.search(text), _DECODED.search(text)
    counters = {name: int(value) for name, value in _COUNTER.findall(text)}
    missing = [what for what, found in (("encoded", encoded), ("decoded", decoded)) if not found]
    missing += [name for name in ("n_draft", "n_drafted", "n_accept") if name not in counters]
    if missing:
        raise PeerOutputError(f"llama-speculative-simple's output lacks {', '.join(missing)}:\n{text[-2000:]}")
    return SpeculativeRun(draft_max=counters["n_draft"], prompt_tokens=int(encoded.group(1)),
                          prompt_seconds=float(encoded.group(2)), decoded_tokens=int(decoded.group(1)),
                          decode_seconds=float(decoded.group(2)), decode_tok_per_s=float(decoded.group(3)),
                          drafted=counters["n_drafted"], accepted=counters["n_accept"])


_SYSTEM_INFO = re.compile(r"system_info: [^\n]*")


def parse_system_info(text: str) -> dict:
    """{"line": the ``system_info:`` line, "features": the CPU features it reports on (``AVX512_VNNI = 1``)}."""
    found = _SYSTEM_INFO.search(text)
    if found is None:
        raise PeerOutputError(f"no system_info line in llama.cpp's output:\n{text[-2000:]}")
    line = found.group(0).strip()
    features = sorted({name for name, value in re.findall(r"\b([A-Z][A-Z0-9_]+) = (\d+)", line) if value == "1"})
    return {"line": line, "features": features}


def _run(command: list[str], timeout: float) -> str:
    log.debug("running %s", " ".join(command))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, errors="replace",
                              env={**os.environ, **PEER_ENV})
    except subprocess.TimeoutExpired as exc:
        raise PeerOutputError(f"{Path(command[0]).name} ran past {timeout:.0f} s") from exc
    text = done.stdout + "\n" + done.stderr
    if done.returncode != 0:
        raise PeerOutputError(f"{Path(command[0]).name} exited with {done.returncode}:\n{text[-3000:]}")
    return text


def run_plain(binaries: PeerBinaries, model: Path, n_gen: int = 96, threads: int = 2, repeats: int = 1,
              timeout: float = 600, repack: bool = True) -> tuple[PlainRun, str]:
    """llama-bench's tg rate for ``model`` (no prompt, ``n_gen`` tokens, ``repeats`` repetitions
    after its own warm-up run); with the raw output, for the record. ``repack``: llama.cpp's
    default weight repacking for its CPU kernels (on an AMX CPU, its AMX layout)."""
    text = _run([str(binaries.bench), "-m", str(model), "-p", "0", "-n", str(n_gen), "-t", str(threads),
                 "-r", str(repeats), "--repack", "1" if repack else "0", "-o", "jsonl"], timeout)
    return parse_bench_jsonl(text)[0], text


def speculative_command(binaries: PeerBinaries, target: Path, drafter: Path, prompt: str, draft_max: int,
                        n_predict: int, threads: int, extra: tuple[str, ...] = (), temperature: float = 0.0,
                        seed: int = 0) -> list[str]:
    """Draft-model speculation, greedy (``temperature`` 0) or sampled; llama.cpp reads the
    prompt's special tokens (a chat template's markers) as tokens, as our tokenizer does.

    Sampled, the target samples at ``temperature`` alone, as Tandem's sampler does by default
    (top-k 0, top-p 1): llama.cpp's own defaults add top-k 40, top-p 0.95 and min-p 0.05, which
    would cut the distribution's tail and make its drafts easier to accept than Tandem's."""
    sampling = ("--temp", "0") if temperature <= 0 else (
        "--temp", f"{temperature:g}", "--top-k", "0", "--top-p", "1.0", "--min-p", "0.0", "--seed", str(seed))
    return [str(binaries.speculative), "-m", str(target), "-md", str(drafter), "-p", prompt, "-n", str(n_predict),
            *sampling, "-t", str(threads), "-td", str(threads), "-c", "2048",
            "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max), *extra]


def run_speculative(binaries: PeerBinaries, target: Path, drafter: Path, prompt: str, draft_max: int,
                    n_predict: int = 96, threads: int = 2, timeout: float = 600, repack: bool = True,
                    temperature: float = 0.0, seed: int = 0) -> tuple[SpeculativeRun, str]:
    extra = () if repack else ("--no-repack",)
    text = _run(speculative_command(binaries, target, drafter, prompt, draft_max, n_predict, threads, extra, temperature, seed),
                timeout)
    return parse_speculative(text), text


def run_system_info(binaries: PeerBinaries, threads: int = 2, timeout: float = 120) -> tuple[dict, str]:
    """llama.cpp's ``system_info`` line (the CPU features its kernels were built for and use), as
    its examples print it, from ``llama_print_system_info`` of the build's own libllama (the
    binaries print it only at a verbosity set after the line is written)."""
    lib = binaries.speculative.parent / "libllama.so"
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.llama_backend_init();"
            " lib.llama_print_system_info.restype = ctypes.c_char_p;"
            " print(f'system_info: n_threads = {sys.argv[2]} | ' + lib.llama_print_system_info().decode())")
    text = _run([sys.executable, "-c", code, str(lib), str(threads)], timeout)
    return parse_system_info(text), text
