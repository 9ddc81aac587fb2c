"""`tandem` command line: set up the default models, compare, benchmark."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from engine.paths import RESOURCES
from engine.settings import DEFAULT_DRAFT_VOCAB


def _progress_printer():
    last = {}

    def show(stage: str, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if last.get(stage) != pct:
            last[stage] = pct
            print(f"\r  {stage:<9} {pct:3d}%", end="" if pct < 100 else "\n", file=sys.stderr, flush=True)

    return show


def default_model_paths(target: str | None, drafter: str | None, need_drafter: bool = True) -> tuple[Path, Path | None]:
    from engine import default_pair

    if target:
        return Path(target), Path(drafter) if drafter else None
    show = _progress_printer()
    t = default_pair.prepare(default_pair.TARGET, show)
    d = default_pair.prepare(default_pair.DRAFTER, show) if need_drafter else None
    return t, Path(drafter) if drafter else d


def _session(args, need_drafter=True):
    from engine.session import Session
    from engine.settings import DrafterOptions

    target, drafter = default_model_paths(args.target, args.drafter_model, need_drafter)
    options = DrafterOptions(head=args.drafter_head, precision=args.drafter_precision, vocab_size=args.draft_vocab_size)
    print(f"loading {target.name}" + (f" + {drafter.name}" if drafter else "") + f" ({args.precision})", file=sys.stderr)
    return Session.load(target, drafter, args.precision, args.device, drafter_options=options)


def cmd_setup(args) -> int:
    default_model_paths(None, None)
    from engine import default_pair
    from kernels import linear, quant_linear

    # Compiles them once, now, rather than on the first request.
    print("CPU kernels: linear", ", ".join(linear.available_backends()), "| int8 linear", ", ".join(quant_linear.available_backends()))
    print("default model pair ready:", *default_pair.installed_paths(), sep="\n  ")
    return 0


def cmd_compare(args) -> int:
    from engine.compare import compare
    from engine.settings import DecodeSettings

    settings = DecodeSettings(mode=args.mode, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_new_tokens=args.max_new_tokens, seed=args.seed, draft_length=args.draft_length)
    session = _session(args, need_drafter=args.drafter == "model")
    result = compare(session, args.prompt, settings, args.drafter)
    p, s = result.plain.stats, result.speculative.stats
    print("=== without speculation ===\n" + result.plain.text)
    print("=== with speculation ===\n" + result.speculative.text)
    rows = [
        ("new tokens", p.new_tokens, s.new_tokens),
        ("seconds", f"{p.seconds:.2f}", f"{s.seconds:.2f}"),
        ("tokens/sec", f"{p.tok_per_s:.2f}", f"{s.tok_per_s:.2f}"),
        ("time to first token", f"{p.ttft_s:.3f}s", f"{s.ttft_s:.3f}s"),
        ("target passes", p.target_passes + 1, s.target_passes + 1),
        ("drafted / accepted", "-", f"{s.drafted} / {s.accepted}"),
        ("acceptance rate", "-", f"{s.acceptance:.1%}"),
        ("accepted per pass", "-", f"{s.mean_accepted_per_pass:.2f} (+1 from target = {s.tokens_per_pass:.2f})"),
        ("acceptance by position", "-", " ".join(f"{a:.2f}" for a in s.acceptance_by_position)),
    ]
    print(f"\n{'':24}{'plain':>12}  speculative ({args.drafter}, {session.precision})")
    for name, a, b in rows:
        print(f"{name:<24}{str(a):>12}  {b}")
    print(f"speedup: {result.speedup:.2f}x")
    if result.identical:
        print("outputs: identical")
    elif result.divergence:
        d = result.divergence
        print(f"outputs: differ from new token {d.position} (target's top-2 logit gap there: {d.top2_gap:.4f};"
              " a near-tie that batched verification rounds differently in fast mode)")
    else:
        print("outputs: differ (sampling: both are valid draws from the same distribution)")
    return 0


def cmd_bench(args) -> int:
    from engine.bench import read_prompts, run_bench

    prompts = read_prompts(args.prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    session = _session(args)
    if args.category:
        prompts = [p for p in prompts if p["category"] in args.category]
    report = run_bench(session, prompts, args.max_new_tokens, args.drafter, hf=not args.no_hf, agreement=not args.no_agreement)
    Path(args.json).write_text(json.dumps(report, indent=1))
    summary = {k: v for k, v in report["summary"].items() if k != "by_category"}
    print(json.dumps({"step_costs": report["step_costs"], **summary}, indent=1))
    for cat, row in report["summary"]["by_category"].items():
        agree = (f"  agreement full {row['agreement_full']:.3f} reduced {row['agreement_reduced']:.3f}"
                 if row["agreement_full"] is not None else "")
        print(f"  {cat:<10} speedup {row['speedup_vs_plain']:.2f}x  acceptance {row['acceptance']:.2f}{agree}")
    print(f"wrote {args.json}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description="Lossless speculative decoding for local models")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_options(p):
        p.add_argument("--precision", choices=["exact", "fast"], default="fast",
                       help="exact: fp32, greedy output token-identical; fast: bf16")
        p.add_argument("--target", help="model folder (default: the offline Qwen2.5-Coder 1.5B)")
        p.add_argument("--drafter-model", help="draft model folder (default: Qwen2.5-Coder 0.5B)")
        p.add_argument("--drafter", choices=["model", "lookup"], default="model")
        p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
        p.add_argument("--max-new-tokens", type=int, default=128)
        p.add_argument("--drafter-head", choices=["pruned", "full"], default="pruned",
                       help="draft from a reduced LM head (frequent tokens + the request's own) or the full vocabulary")
        p.add_argument("--drafter-precision", choices=["auto", "int8", "bf16", "fp32"], default="auto",
                       help="drafter weights; auto: int8 where the fast CPU kernel runs (never changes the output)")
        p.add_argument("--draft-vocab-size", type=int, default=DEFAULT_DRAFT_VOCAB,
                       help="tokens kept by the pruned drafter head")

    p = sub.add_parser("setup", help="assemble, verify and convert the default offline model pair")
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("compare", help="run a prompt with and without speculation")
    p.add_argument("prompt")
    p.add_argument("--mode", choices=["greedy", "sample"], default="greedy")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft-length", type=int, default=None, help="fixed k (default: adaptive)")
    model_options(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("bench", help="benchmark against transformers' generate on a prompt set")
    p.add_argument("--prompts", default=str(RESOURCES / "prompts" / "bench.jsonl"))
    p.add_argument("--json", default="bench.json")
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    p.add_argument("--category", action="append", help="only prompts of this category (repeatable)")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' generate reference runs")
    p.add_argument("--no-agreement", action="store_true", help="skip the teacher-forced drafter agreement")
    model_options(p)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a readable message, not a traceback, for expected failures
        if args.verbose:
            raise
        print(f"tandem: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
