"""`tandem bench`: our plain and speculative decoding on a prompt set, next to transformers'."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.cli.common import check_writable, default_model_paths, drafter_options, load_session, model_options, write_json_atomically
from engine.core.paths import RESOURCES


def run(args) -> int:
    import gc

    from engine.bench.suite import baseline_plain, read_prompts, run_bench, select_prompts
    from engine.core.settings import DecodeSettings, InvalidRequest
    from engine.models.precision_labels import label_for
    from engine.session.session import Session

    # Every input first, in milliseconds: the models take a minute to load, the run much longer.
    if args.repeats < 1:
        raise InvalidRequest(f"--repeats must be at least 1, not {args.repeats}")
    if args.threads < 0:
        raise InvalidRequest(f"--threads must be >= 0 (0: torch's choice), not {args.threads}")
    DecodeSettings(max_new_tokens=args.max_new_tokens)
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
    # Saved after every prompt: a failure (or Ctrl-C) later keeps the results so far.
    report = run_bench(session, prompts, args.max_new_tokens, args.drafter, hf=not args.no_hf, agreement=not args.no_agreement,
                       baseline=baseline, repeats=args.repeats, on_report=lambda r: write_json_atomically(out, r))
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
    p.add_argument("--baseline-precision", choices=["file", "fast", "exact", "int8", "int4"],
                   help="also time plain decoding of the same prompts at this precision, in the same run (e.g."
                        " --precision int8 --baseline-precision fast: what quantizing the target buys; for the"
                        " default pair, --baseline-precision int4 times its converted folder next to its GGUF file)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    model_options(p)
    p.set_defaults(func=run)
