"""What speculation costs on a GGUF target, measured side by side in one process: a one-row
decode step, a verification pass of ``--verify-rows`` rows, and one draft step of each drafter
(the drafter's GGUF file on its own blocks, the converted folder at int8 and int4 on Tandem's
kernels), interleaved so that all see the same machine load.

    python scripts/gguf_speculation_bench.py [--threads 1 2] [--baseline-rev HEAD~2]

``--baseline-rev``: also time the target's step and verification on the GGUF kernel sources of
that git revision (compiled under another name), alternating with the working tree's, so a
kernel change is measured before / after in one run. ``TANDEM_AVX512=0`` runs every kernel's
AVX2 tiles (an AVX2-only CPU's). Prints medians in ms, the tile set and the load average.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.cli.common import default_model_paths
from engine.core.paths import cache_dir
from engine.core.sampler import Sampler
from engine.core.settings import DecodeSettings, DrafterOptions
from engine.models.runners.runner import ModelRunner
from engine.session.session import Session
from kernels import gguf_linear
from kernels.gguf_linear import cpu_avx2

DRAFTER_GGUF = "qwen2.5-coder-0.5b-instruct-q5_0.gguf"
DRAFTER_FOLDER = "qwen2.5-coder-0.5b-instruct"


def baseline_module(rev: str, package: str = "gguf_linear", source: str = "gguf_linear_avx2.cpp",
                    flags: tuple[str, ...] = ("-mf16c", "-ffp-contract=off")):
    """A kernel package's AVX2 extension as of ``rev``, compiled from a copy of its sources with
    the ``flags`` its cpu_avx2.py gives: the GGUF linears by default; the attention with
    ``package="attention", source="attention_avx2.cpp", flags=("-mf16c",)``; the int4 linears with
    ``package="int4_linear", source="int4_linear_avx2.cpp", flags=("-mf16c",)``."""
    from kernels.build import compile_avx2

    folder = Path(tempfile.mkdtemp(prefix=f"{package}_baseline_"))
    listed = subprocess.run(["git", "ls-tree", "--name-only", rev, f"kernels/{package}/"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split()
    names = [Path(p).name for p in listed if p.endswith((".cpp", ".h", ".inc"))]
    for name in names:
        text = subprocess.run(["git", "show", f"{rev}:kernels/{package}/{name}"], cwd=ROOT, check=True,
                              capture_output=True).stdout
        (folder / name).write_bytes(text)
    for shared in (ROOT / "kernels").glob("*.h"):  # the headers every package shares, as they are now
        (folder / shared.name).write_bytes(shared.read_bytes())
    headers = tuple(sorted(p for p in folder.iterdir() if p.suffix in (".h", ".inc")))
    return compile_avx2(f"tandem_{package}_baseline_{rev.replace('~', '_').replace('^', '_')}", folder / source,
                        headers, flags)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def target_costs(runner: ModelRunner, context: list[int], rows: int) -> tuple[float, float]:
    """(one-row step ms, ``rows``-row verification ms), each after the same ``len(context) - 1``
    cached tokens (the runner holds those on entry and on return)."""
    n = len(context)
    step = timed(lambda: runner.forward(context[-1:]))
    runner.crop(n - 1)
    verify = timed(lambda: runner.forward(context[-rows:], n_logits=rows))
    runner.crop(n - 1)
    return step, verify


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--verify-rows", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--baseline-rev", help="also time the GGUF kernels of this git revision")
    args = parser.parse_args()
    home = cache_dir()
    target_path, _ = default_model_paths(None, None, need_drafter=False, precision="file")
    drafters = {"gguf Q5_0": (home / "gguf" / DRAFTER_GGUF, "auto"),
                "folder int8": (home / "models" / DRAFTER_FOLDER, "int8"),
                "folder int4": (home / "models" / DRAFTER_FOLDER, "int4")}
    sessions = {name: Session.load(target_path, path, "file", "cpu", drafter_options=DrafterOptions(precision=precision))
                for name, (path, precision) in drafters.items()}
    first = next(iter(sessions.values()))
    kernels = {"working tree": cpu_avx2._module}
    if args.baseline_rev:
        old = baseline_module(args.baseline_rev)
        kernels[args.baseline_rev] = lambda: old
    prompt = first.encode("Write a Python function that parses a CSV file with a header row and returns a list of dicts.")
    context = (prompt * 4)[:200]
    sampler = Sampler(DecodeSettings())
    runner = ModelRunner(first.target.model)
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, module in kernels.items():
            cpu_avx2._module = module
            runner.reset()
            runner.forward(context[:-1])
            target_costs(runner, context, args.verify_rows)  # warm
        for session in sessions.values():
            session.model_drafter.prepare(context)
        times: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for name, module in kernels.items():
                cpu_avx2._module = module
                step, verify = target_costs(runner, context, args.verify_rows)
                times.setdefault(f"target step ({name})", []).append(step)
                times.setdefault(f"target {args.verify_rows}-row verify ({name})", []).append(verify)
            cpu_avx2._module = kernels["working tree"]
            for label, session in sessions.items():
                drafter = session.model_drafter
                times.setdefault(f"draft step, {label}", []).append(timed(lambda d=drafter: d.propose(context, 1, sampler)))
                drafter.observe(len(context) - 1)
        cpu_avx2._module = kernels["working tree"]
        load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        print(f"\n{threads} thread(s), {gguf_linear.backend_name()}, load average {load}; median of {args.repeats} ms")
        step = statistics.median(times["target step (working tree)"])
        for label, values in times.items():
            ms = statistics.median(values)
            print(f"  {label:44} {ms:8.1f}   ({ms / step:4.2f} target steps)")


if __name__ == "__main__":
    main()
