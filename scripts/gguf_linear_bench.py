"""Time the GGUF-native linear at the default target's layer shapes, on both tile sets, against
the int4 kernel (kernels/int4_linear) at the same shapes in the same run.

    python scripts/gguf_linear_bench.py [--threads 2 --rows 1 5 9 53 --types Q4_K Q6_K]
    python scripts/gguf_linear_bench.py --model drafter      # the 0.5B drafter's shapes, Q5_0 and Q8_0
    python scripts/gguf_linear_bench.py --gguf FILE.gguf     # every matmul of a real model, in order

Weights come from memory, as in a real forward pass (the model is far larger than the caches):
each timed call uses the next of enough copies to overflow the L3 cache. Prints ms per
call (the fastest of the repeats: see best_ms), the weight bytes per second that implies for one row, and the tile set that ran.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf import GGMLQuantizationType as T

from kernels import gguf_linear, int4_linear
from kernels.gguf_linear import blocks

# (name, N, K) of the default pair's linear layers (Qwen2.5-Coder 1.5B target, 0.5B drafter),
# and the GGUF types their files hold most.
SHAPES = {
    "target": [("q/o 1536x1536", 1536, 1536), ("k/v 256x1536", 256, 1536), ("gate/up 8960x1536", 8960, 1536),
               ("down 1536x8960", 1536, 8960)],
    "drafter": [("q/o 896x896", 896, 896), ("k/v 128x896", 128, 896), ("gate/up 4864x896", 4864, 896),
                ("down 896x4864", 896, 4864)],
}
TYPES = {"target": ["Q4_K", "Q6_K"], "drafter": ["Q5_0", "Q8_0"]}
STREAM_BYTES = 96 << 20  # per variant: past the L3 cache, so that weights come from memory


def random_raw(qtype, n, k, gen):
    values, size = blocks.block_shape(qtype)
    raw = torch.randint(0, 256, (n, k // values, size), dtype=torch.uint8, generator=gen)
    fields = {T.Q6_K: (208,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q4_1: (0, 2), T.Q5_1: (0, 2)}.get(qtype, (0,))
    for at in fields:
        raw[..., at:at + 2] = (torch.randn(n, k // values, generator=gen) * 0.01).half().view(torch.uint8).reshape(n, -1, 2)
    return raw.reshape(n, -1)


def best_ms(calls, repeats: int) -> float:
    """The fastest of ``repeats`` calls (calls: functions each using its own copy of the weights,
    cycled through). The fastest, not the median: on a shared machine a call that loses one of
    its threads to another process for a time slice takes milliseconds longer."""
    for call in calls[:2]:
        call()
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        calls[i % len(calls)]()
        times.append((time.perf_counter() - start) * 1000)
    return min(times)


def copies(nbytes: int) -> int:
    return max(2, STREAM_BYTES // max(nbytes, 1))


def set_tiles(tiles: str) -> None:
    """"avx2", "avx512_vnni" or "amx_int8" (the GGUF kernel's Q4_K / Q6_K on AMX for 2 or more
    rows, the rest and the int4 kernel on VNNI)."""
    from kernels.gguf_linear import cpu_avx2 as gguf_cpu
    from kernels.int4_linear import cpu_avx2 as int4_cpu

    gguf_cpu.gguf_allow_vnni(tiles != "avx2")
    gguf_cpu.gguf_allow_amx(tiles == "amx_int8")
    int4_cpu.int4_allow_vnni(tiles != "avx2")
    assert gguf_cpu.gguf_isa() == tiles and int4_cpu.int4_isa() == ("avx2" if tiles == "avx2" else "avx512_vnni")


def tile_sets_here() -> list[str]:
    """The tile sets this CPU runs, plainest first."""

    found = ["avx2"]
    for tiles in ("avx512_vnni", "amx_int8"):
        try:
            set_tiles(tiles)
            found.append(tiles)
        except AssertionError:
            break
    return found


def time_model(path: Path, rows: list[int], repeats: int) -> None:
    """One pass over every linear weight of a GGUF file (the output projection included, the
    embedding table not: a lookup), in file order, from its memory map: a decode step's (and a
    verification block's) matmuls, without attention and norms."""
    import gguf

    weights = []
    for tensor in gguf.GGUFReader(path).tensors:
        if len(tensor.shape) == 2 and tensor.tensor_type in gguf_linear.SUPPORTED_TYPES and "token_embd" not in tensor.name:
            weights.append(gguf_linear.prepare(tensor.data, tensor.tensor_type, int(tensor.shape[1]), int(tensor.shape[0])))
    total = sum(w.nbytes for w in weights)
    kinds = sorted({w.qtype.name for w in weights})
    print(f"{path.name}: {len(weights)} weights ({', '.join(kinds)}), {total / 1e6:.0f} MB")
    gen = torch.Generator().manual_seed(0)
    for m in rows:
        inputs = {k: torch.randn(m, k, generator=gen) for k in {w.k for w in weights}}
        best = best_ms([lambda inputs=inputs: [gguf_linear.linear(inputs[w.k], w) for w in weights]], repeats)
        print(f"  M={m:<3} {best:8.2f} ms a pass  ({total / (best * 1e-3) / 1e9:5.1f} GB/s; "
              f"{best / m:6.2f} ms a row)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 9, 53])
    parser.add_argument("--model", choices=sorted(SHAPES), default="target")
    parser.add_argument("--types", nargs="+", help="GGUF types (default: the model's own)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--gguf", type=Path, help="time every linear weight of this GGUF file instead")
    parser.add_argument("--tiles", nargs="+", choices=["avx2", "avx512_vnni", "amx_int8"],
                        help="only these tile sets (default: every one this CPU has)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if gguf_linear.active_backend() != "cpu_avx2" or int4_linear.active_backend() != "cpu_avx2":
        sys.exit("the compiled kernels are not available here")
    gen = torch.Generator().manual_seed(0)
    x_all = torch.randn(max(args.rows), max(k for _, _, k in SHAPES[args.model]), generator=gen)
    tile_sets = [t for t in tile_sets_here() if args.tiles is None or t in args.tiles]
    if args.gguf is not None:
        for tiles in tile_sets:
            set_tiles(tiles)
            print(f"{args.threads} threads, {gguf_linear.backend_name()}, best of {args.repeats}")
            time_model(args.gguf, args.rows, args.repeats)
        return
    print(f"{args.model} shapes, {args.threads} threads, best ms per call of {args.repeats}; "
          f"GB/s: weight bytes / time at M=1")
    head = f"{'':34}" + "".join(f"{'M=' + str(m):>8}" for m in args.rows) + f"{'GB/s':>7}  {'9 rows / 1':>10}"
    for name, n, k in SHAPES[args.model]:
        layers = {}
        for qname in args.types or TYPES[args.model]:
            qtype = T[qname]
            raw = random_raw(qtype, n, k, gen)
            layers[f"gguf {qname}"] = ([gguf_linear.prepare(raw.clone(), qtype, n, k) for _ in range(copies(raw.numel()))],
                                       raw.numel(), lambda x, w: gguf_linear.linear(x, w))
        packed = int4_linear.quantize(torch.randn(n, k, generator=gen) * 0.02)
        nbytes = sum(t.numel() * t.element_size() for t in packed)
        layers["int4 (kernels/int4_linear)"] = ([tuple(t.clone() for t in packed) for _ in range(copies(nbytes))], nbytes,
                                                lambda x, w: int4_linear.linear(x, *w))
        print(f"\n{name}\n{head}")
        for tiles in tile_sets:
            set_tiles(tiles)
            for label, (weights, nbytes, fn) in layers.items():
                times = []
                for m in args.rows:
                    x = x_all[:m, :k].contiguous()
                    times.append(best_ms([lambda w=w, x=x, fn=fn: fn(x, w) for w in weights], args.repeats))
                gbs = nbytes / (times[0] * 1e-3) / 1e9
                ratio = (times[args.rows.index(9)] / times[0]) if 9 in args.rows and 1 in args.rows else float("nan")
                print(f"{label + ' ' + tiles:34}" + "".join(f"{t:8.3f}" for t in times) + f"{gbs:7.1f}  {ratio:10.2f}")
    set_tiles(tile_sets[-1])


if __name__ == "__main__":
    main()
