"""`tandem bench`: our plain and speculative decoding on a prompt set, next to transformers'."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.bench.background_load import add_load_options
from engine.cli.common import (
    check_writable,
    default_model_paths,
    drafter_options,
    load_session,
    model_options,
    write_json_atomically,
)
from engine.core.paths import RESOURCES
from engine.core.settings import PRECISIONS, precision_name


def parse_seeds(text: str) -> list[int]:
    """--seeds: "N" (a count: seeds 0 to N-1) or "S1,S2,..." (these seeds; "7," is seed 7 alone)."""
    from engine.core.settings import InvalidRequest

    parts = [p.strip() for p in text.split(",")]
    try:
        numbers = [int(p) for p in parts if p]
    except ValueError:
        raise InvalidRequest(f"--seeds takes a count N or a list S1,S2,... of whole numbers, not {text!r}") from None
    if not numbers:
        raise InvalidRequest(f"--seeds takes a count N or a list S1,S2,... of whole numbers, not {text!r}")
    if len(parts) == 1:
        if numbers[0] < 1:
            raise InvalidRequest(f"--seeds N must be at least 1, not {numbers[0]}")
        return list(range(numbers[0]))
    seeds = numbers
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise InvalidRequest(f"--seeds must list distinct seeds >= 0, not {text!r}")
    return seeds


def run(args) -> int:
    import contextlib
    import gc

    from engine.bench.background_load import load_from_args
    from engine.bench.prompt_sets import read_prompts, select_prompts
    from engine.bench.suite import baseline_plain, run_bench
    from engine.core.settings import DecodeSettings, InvalidRequest
    from engine.models.loading.file_precision import label_for
    from engine.session.session import Session

    # Every input first, in milliseconds: the models take a minute to load, the run much longer.
    if args.repeats < 1:
        raise InvalidRequest(f"--repeats must be at least 1, not {args.repeats}")
    if args.threads < 0:
        raise InvalidRequest(f"--threads must be >= 0 (0: torch's choice), not {args.threads}")
    if args.mode == "sample":
        seeds = parse_seeds(args.seeds or "3")
        for seed in seeds:
            DecodeSettings(mode="sample", temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=seed)
    else:
        if args.seeds is not None:
            raise InvalidRequest("--seeds applies to --mode sample (greedy decoding has no seed)")
        seeds = []
        DecodeSettings(max_new_tokens=args.max_new_tokens)
    try:
        load = load_from_args(args)
    except ValueError as e:
        raise InvalidRequest(str(e)) from None
    drafter_options(args)
    prompts = select_prompts(read_prompts(args.prompts), args.category, args.limit)
    out = check_writable(Path(args.json))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    baseline = None
    if args.baseline_precision:
        # First, alone in memory: the same target at the baseline precision, plain decoding only.
        target, _ = default_model_paths(args.target, args.drafter_model, need_drafter=False, precision=args.baseline_precision)
        print(f"baseline: loading {target.name} ({args.baseline_precision}: {label_for(args.baseline_precision, target)})",
              file=sys.stderr)
        other = Session.load(target, None, args.baseline_precision, args.device)
        baseline = baseline_plain(other, prompts, args.max_new_tokens)
        del other
        gc.collect()
    session = load_session(args)
    from kernels import cpu_kernel_report

    kernels = cpu_kernel_report()  # which backends and tile sets ran (compiled by the load already)
    print(f"CPU kernels: {kernels}", file=sys.stderr)
    if args.mode == "sample" and not args.no_hf:
        print("note: transformers' reference runs are greedy only; a sampled bench skips them", file=sys.stderr)
    with load if load.active else contextlib.nullcontext():
        if load.active:
            print(f"background load: {load.text()} (child processes, stopped at the end)", file=sys.stderr)
        # Saved after every prompt: a failure (or Ctrl-C) later keeps the results so far.
        report = run_bench(session, prompts, args.max_new_tokens, args.drafter, hf=not args.no_hf, agreement=not args.no_agreement,
                           baseline=baseline, repeats=args.repeats, on_report=lambda r: write_json_atomically(out, r),
                           mode=args.mode, temperature=args.temperature, seeds=seeds,
                           more_settings=lambda: {"cpu_kernels": kernels,
                                                  "background_load": load.describe() if load.active else None})
    summary = {k: v for k, v in report["summary"].items() if k != "by_category"}
    print(json.dumps({"step_costs": report["step_costs"], **summary}, indent=1))
    found = report["summary"]["decode_speedup_spread"]
    if found:
        what = f"{len(seeds)} seeds at T={args.temperature:g}" if seeds else "greedy"
        ci = f", 95% interval {found['ci95'][0]:.2f}-{found['ci95'][1]:.2f}x" if found["ci95"] else ""
        print(f"decode speedup ({what}): geometric mean {found['geomean']:.2f}x over {found['n']} runs, "
              f"min {found['min']:.2f}x, max {found['max']:.2f}x{ci}")
        print("acceptance by draft position: " + " ".join(f"{a:.2f}" for a in report["summary"]["acceptance_by_position"]))
    if load.active:
        used = report["settings"]["background_load"]
        cores = f"{used['busy_cores']:.2f} cores busy on average" if used.get("busy_cores") is not None else "busy cores unknown"
        print(f"background load: {load.text()} ({cores})")
    for cat, row in report["summary"]["by_category"].items():
        agree = (f"  agreement full {row['agreement_full']:.3f} reduced {row['agreement_reduced']:.3f}"
                 if row["agreement_full"] is not None else "")
        versus = (f"  plain vs {args.baseline_precision} plain {row['plain_vs_baseline_plain']:.2f}x"
                  if row.get("plain_vs_baseline_plain") else "")
        print(f"  {cat:<10} {args.precision}: plain {row['plain_tok_per_s']:.2f} tok/s, speculative {row['speculative_tok_per_s']:.2f}"
              f" tok/s, speedup {row['speedup_vs_plain']:.2f}x (decode only: {row['plain_decode_tok_per_s']:.2f} -> "
              f"{row['speculative_decode_tok_per_s']:.2f} tok/s, {row['decode_speedup_vs_plain']:.2f}x)"
              f"  acceptance {row['acceptance']:.2f}{versus}{agree}")
    print(f"wrote {args.json}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark against transformers' generate on a prompt set")
    p.add_argument("--prompts", default=str(RESOURCES / "prompts" / "bench.jsonl"))
    p.add_argument("--json", default="bench.json")
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    p.add_argument("--category", action="append", help="only prompts of this category (repeatable)")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' generate reference runs")
    p.add_argument("--no-agreement", action="store_true", help="skip the teacher-forced drafter agreement")
    p.add_argument("--repeats", type=int, default=1,
                   help="time plain and speculative decoding of each prompt this many times, alternating, "
                        "and report the median run of each, and the median of their decode rates (for noisy, shared machines)")
    p.add_argument("--baseline-precision", type=precision_name, choices=PRECISIONS,
                   help="also time plain decoding of the same prompts at this precision, in the same run (e.g."
                        " --precision int8 --baseline-precision bf16: what quantizing the target buys; for the"
                        " default pair, --baseline-precision int4 times its converted folder next to its GGUF file)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--mode", choices=["greedy", "sample"], default="greedy",
                   help="greedy (outputs compared token for token, the default) or sample: each prompt at every"
                        " seed of --seeds, plain and speculative timed at each")
    p.add_argument("--temperature", type=float, default=1.0, help="with --mode sample (default 1.0, the server's)")
    p.add_argument("--seeds", default=None,
                   help="with --mode sample: N (seeds 0 to N-1) or S1,S2,... (default 3)")
    add_load_options(p, "during the timed runs")
    model_options(p)
    p.set_defaults(func=run)
