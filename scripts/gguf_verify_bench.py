"""What a verification pass costs against a one-row step on the default GGUF target, in the runner
decoding uses (GgufRunner), after a given number of cached tokens; and a prefill chunk's rate.
Kernel variants alternate in one process, so that all see the same machine load:

    python scripts/gguf_verify_bench.py [--cached 256 4096] [--verify-rows 5] [--prefill 512]
        [--without-amx] [--file-layout] [--baseline-rev HEAD] [--attention-baseline-rev HEAD]

``--without-amx``: also time the working tree with its AMX tiles off (the VNNI tiles instead);
``--file-layout``: also time the working tree's tiles on the file's rows, not the Q4_K / Q6_K
layout they pack at load (where the AVX2 tiles, or the VNNI tiles without AMX, run);
``--amx-rows``: the row count from which the working tree takes them (to choose where they pay);
``--baseline-rev``: also time the GGUF kernel sources of that git revision (compiled under
another name, see gguf_speculation_bench.baseline_module); ``--attention-baseline-rev``: also time
the working tree with the attention kernel of that revision. Prints medians in ms (prefill in
tokens a second), each variant's tile set, and the load average.
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

from engine.cli.common import default_model_paths
from engine.models.loading.loader import load_model
from engine.models.runners.gguf_runner import GgufRunner
from kernels.attention import cpu_avx2 as attention_avx2
from kernels.gguf_linear import cpu_avx2


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cached", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--verify-rows", type=int, nargs="+", default=[5])
    parser.add_argument("--prefill", type=int, default=512, help="prefill chunk rows (0: none)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--without-amx", action="store_true", help="also time the working tree's VNNI tiles alone")
    parser.add_argument("--file-layout", action="store_true",
                        help="also time the working tree's tiles on the file's layout (not the packed Q4_K / Q6_K)")
    parser.add_argument("--baseline-rev", help="also time the GGUF kernels of this git revision")
    parser.add_argument("--attention-baseline-rev", help="also time the attention kernel of this git revision")
    parser.add_argument("--target", help="a GGUF file (default: the default pair's target)")
    parser.add_argument("--amx-rows", type=int, default=0,
                        help="input rows from which the working tree takes the AMX tiles (default: its own choice)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = default_model_paths(args.target, None, need_drafter=False, precision="file")
    model = load_model(target, "file", "cpu", check_memory=False).model
    runner = GgufRunner(model)
    tree = cpu_avx2._module()
    if args.amx_rows:
        tree.gguf_amx_rows(args.amx_rows)
    attention_tree = attention_avx2._module()
    attention_of = {}  # variant -> the attention module it runs, where not the working tree's
    variants = {"working tree": (tree, True)}
    if args.without_amx:
        variants["working tree, AMX off"] = (tree, False)
    if args.file_layout:
        variants["working tree, file layout"] = (tree, True)
    if args.baseline_rev:
        from gguf_speculation_bench import baseline_module

        variants[args.baseline_rev] = (baseline_module(args.baseline_rev), True)

    if args.attention_baseline_rev:
        from gguf_speculation_bench import baseline_module

        name = f"attention of {args.attention_baseline_rev}"
        variants[name] = (tree, True)
        attention_of[name] = baseline_module(args.attention_baseline_rev, "attention", "attention_avx2.cpp", ("-mf16c",))

    def use(name: str) -> str:
        module, amx = variants[name]
        cpu_avx2._module = lambda: module
        attention = attention_of.get(name, attention_tree)
        attention_avx2._module = lambda: attention
        if hasattr(module, "gguf_allow_amx"):
            module.gguf_allow_amx(amx)
        if hasattr(module, "gguf_allow_packed"):
            module.gguf_allow_packed(not name.endswith("file layout"))
        return module.gguf_isa()

    tiles = {name: use(name) for name in variants}
    rng = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, 20000, (max(args.cached) + max(args.verify_rows) + args.prefill + 1,), generator=rng).tolist()
    times: dict[str, list[float]] = {}
    for cached in args.cached:
        runner.reset()
        use("working tree")
        for start in range(0, cached, 512):  # the cache, once, in chunks as a prompt's prefill
            runner.forward(tokens[start:min(start + 512, cached)])
        for name in variants:  # warm
            use(name)
            runner.forward(tokens[cached:cached + 1])
            runner.crop(cached)
        for _ in range(args.repeats):
            for name in variants:
                use(name)
                times.setdefault(f"{cached}: step ({name})", []).append(timed(lambda: runner.forward(tokens[cached:cached + 1])))
                runner.crop(cached)
                for k in args.verify_rows:
                    rows = tokens[cached:cached + k]
                    times.setdefault(f"{cached}: {k}-row verify ({name})", []).append(
                        timed(lambda rows=rows: runner.forward(rows, n_logits=len(rows))))
                    runner.crop(cached)
    if args.prefill:
        for _ in range(max(3, args.repeats // 2)):
            for name in variants:
                use(name)
                runner.reset()
                ms = timed(lambda: runner.forward(tokens[:args.prefill]))
                times.setdefault(f"prefill {args.prefill} ({name})", []).append(args.prefill / ms * 1000)
    use("working tree")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"{args.threads} thread(s), load average {load}; median of {args.repeats}; tiles: "
          + ", ".join(f"{name} {t}" for name, t in tiles.items()))
    for cached in args.cached:
        for name in variants:
            step = statistics.median(times[f"{cached}: step ({name})"])
            verified = [(k, statistics.median(times[f"{cached}: {k}-row verify ({name})"])) for k in args.verify_rows]
            print(f"  {cached:5} cached, {name:24} step {step:7.1f} ms" +
                  "".join(f"   {k} rows {ms:7.1f} ms ({ms / step:4.2f} steps)" for k, ms in verified))
    if args.prefill:
        for name in variants:
            print(f"  prefill {args.prefill}, {name:24} {statistics.median(times[f'prefill {args.prefill} ({name})']):7.1f} tok/s")


if __name__ == "__main__":
    main()
