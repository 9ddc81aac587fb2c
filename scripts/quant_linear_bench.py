"""Time one linear layer at decode/verification row counts: bf16 vs int8 weight-only kernels.

    python scripts/quant_linear_bench.py [--in 1536 --out 8960 --threads 2 --rows 1 5 9]

Prints median ms per call for: torch bf16 linear, kernels.linear (bf16 AVX2), torch's
_weight_int8pack_mm, and kernels.quant_linear (int8 AVX2), and whether each is batch-invariant
(row 0 of an M-row call bit-identical to the 1-row call).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import linear as linear_kernels  # noqa: E402
from kernels import quant_linear  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--in", dest="k", type=int, default=1536)
    parser.add_argument("--out", dest="n", type=int, default=8960)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 9])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(args.n, args.k, generator=gen) * 0.02).to(torch.bfloat16)
    q, scale = quant_linear.quantize(w)
    scale_bf16 = scale.to(torch.bfloat16)
    fast = linear_kernels.fast_backend() is not None and quant_linear.fast_backend() is not None
    variants = {
        "torch bf16": lambda x: torch.nn.functional.linear(x.to(torch.bfloat16), w),
        "torch int8pack": lambda x: torch._weight_int8pack_mm(x.to(torch.bfloat16), q, scale_bf16),
    }
    if fast:
        variants["ours bf16"] = lambda x: linear_kernels.linear(x, w)
        variants["ours int8"] = lambda x: quant_linear.linear(x, q, scale)
    print(f"linear {args.k} -> {args.n}, {args.threads} threads, median ms of {args.repeats}")
    print(f"{'':16}" + "".join(f"{'M=' + str(m):>9}" for m in args.rows) + "  batch-invariant")
    x_all = torch.randn(max(args.rows), args.k, generator=gen)
    for name, fn in variants.items():
        row = [median_ms(lambda m=m: fn(x_all[:m]), args.repeats) for m in args.rows]
        one = fn(x_all[:1])
        invariant = all(torch.equal(fn(x_all[:m])[i], one[0] if i == 0 else fn(x_all[i:i + 1])[0])
                        for m in args.rows for i in range(m))
        print(f"{name:<16}" + "".join(f"{t:9.2f}" for t in row) + f"  {invariant}")


if __name__ == "__main__":
    main()
