"""The int4 linear kernel on a draft model's layer shapes, at the row counts a drafter feeds:
one (a draft step), two (after an accepted draft), a few (catching up) and a window prefill.
Weights for ``--layers`` layers, so that they stream from memory as in a real pass.

    python scripts/int4_linear_bench.py [--baseline-rev HEAD~1] [--rows 1 2 5 8 64] [--threads 1 2]

``--baseline-rev``: also time that git revision's int4 kernel (compiled under another name),
alternating with the working tree's, so a kernel change is measured before / after in one run.
Prints medians in ms, ms a row, the tile set that ran and the load average.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from kernels import int4_linear  # noqa: E402
from kernels.int4_linear import cpu_avx2  # noqa: E402

# A Qwen2.5-0.5B decoder layer (the default pair's drafter): q/k/v in one, o, gate, up, down.
SHAPES = ((1152, 896), (896, 896), (4864, 896), (4864, 896), (896, 4864))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-rev", default=None)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 8, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    kernels = {"now": cpu_avx2._module()}
    if args.baseline_rev:
        from gguf_speculation_bench import baseline_module

        kernels[args.baseline_rev] = baseline_module(args.baseline_rev, "int4_linear", "int4_linear_avx2.cpp", ("-mf16c",))
    gen = torch.Generator().manual_seed(0)
    layers = [[int4_linear.quantize(torch.randn(n, k, generator=gen) * 0.05) for n, k in SHAPES] for _ in range(args.layers)]
    print(f"tiles: {kernels['now'].int4_isa()}; {args.layers} layers of {SHAPES}; "
          f"load average {os.getloadavg()[0]:.2f}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for rows in args.rows:
            inputs = {k: torch.randn(rows, k, generator=gen) for k in {k for _, k in SHAPES}}
            times: dict[str, list[float]] = {name: [] for name in kernels}
            for repeat in range(args.repeats):
                order = list(kernels.items())
                for name, module in order if repeat % 2 == 0 else order[::-1]:
                    start = time.perf_counter()
                    for layer in layers:
                        for (packed, scale, offset), (_, k) in zip(layer, SHAPES):
                            module.linear_int4w(inputs[k], packed, scale, offset, None)
                    times[name].append((time.perf_counter() - start) * 1000)
            medians = {name: statistics.median(t) for name, t in times.items()}
            line = "  ".join(f"{name} {ms:7.1f} ms ({ms / rows:5.2f} a row)" for name, ms in medians.items())
            if args.baseline_rev:
                line += f"  {medians[args.baseline_rev] / medians['now']:.2f}x"
            print(f"threads {threads} rows {rows:3d}: {line}", flush=True)


if __name__ == "__main__":
    main()
