"""`tandem bench`: our plain and speculative decoding on a prompt set, next to transformers'."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.cli.common import default_model_paths, load_session, model_options
from engine.core.paths import RESOURCES


def run(args) -> int:
    import gc

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from engine.bench.suite import baseline_plain, read_prompts, run_bench
    from engine.session.session import Session

    prompts = read_prompts(args.prompts)
    if args.category:
        prompts = [p for p in prompts if p["category"] in args.category]
    if args.limit:
        prompts = prompts[: args.limit]
    baseline = None
    if args.baseline_precision:
        # First, alone in memory: the same target at the baseline precision, plain decoding only.
        target, _ = default_model_paths(args.target, args.drafter_model, need_drafter=False)
        print(f"baseline: loading {target.name} ({args.baseline_precision})", file=sys.stderr)
        other = Session.load(target, None, args.baseline_precision, args.device)
        baseline = baseline_plain(other, prompts, args.max_new_tokens)
        del other
        gc.collect()
    session = load_session(args)
    report = run_bench(session, prompts, args.max_new_tokens, args.drafter, hf=not args.no_hf, agreement=not args.no_agreement,
                       baseline=baseline, repeats=args.repeats)
    Path(args.json).write_text(json.dumps(report, indent=1))
    summary = {k: v for k, v in report["summary"].items() if k != "by_category"}
    print(json.dumps({"step_costs": report["step_costs"], **summary}, indent=1))
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
                        "and report the median run of each (for noisy, shared machines)")
    p.add_argument("--baseline-precision", choices=["exact", "fast", "int8", "int4"],
                   help="also time plain decoding of the same prompts at this precision, in the same run (e.g."
                        " --precision int8 --baseline-precision fast: what quantizing the target buys)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    model_options(p)
    p.set_defaults(func=run)
