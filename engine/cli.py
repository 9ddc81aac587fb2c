"""`tandem` command line: set up the default models, compare, benchmark."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from engine.paths import RESOURCES
from engine.settings import DEFAULT_DRAFT_VOCAB, DEFAULT_MIN_CONFIDENCE


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
    options = DrafterOptions(head=args.drafter_head, precision=args.drafter_precision, vocab_size=args.draft_vocab_size,
                             min_confidence=args.min_confidence, lookup=not args.no_lookup)
    print(f"loading {target.name}" + (f" + {drafter.name}" if drafter else "") + f" ({args.precision})", file=sys.stderr)
    return Session.load(target, drafter, args.precision, args.device, drafter_options=options)


def cmd_setup(args) -> int:
    default_model_paths(None, None)
    from engine import default_pair
    from kernels import cpu_kernel_report

    # Compiles them once, now, rather than on the first request (or inside a timed test).
    print("CPU kernels:", cpu_kernel_report())
    print("default model pair ready:", *default_pair.installed_paths(), sep="\n  ")
    return 0


def cmd_compare(args) -> int:
    from engine.compare import compare
    from engine.settings import DecodeSettings

    settings = DecodeSettings(mode=args.mode, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_new_tokens=args.max_new_tokens, seed=args.seed, draft_length=args.draft_length)
    session = _session(args, need_drafter=args.drafter == "model")
    used = session.drafter(args.drafter)
    if session.drafter_note:
        print(f"note: {session.drafter_note}", file=sys.stderr)
    result = compare(session, args.prompt, settings, args.drafter)
    p, s = result.plain.stats, result.speculative.stats
    print("=== without speculation ===\n" + result.plain.text)
    print("=== with speculation ===\n" + result.speculative.text)
    rows = [
        ("new tokens", p.new_tokens, s.new_tokens),
        ("seconds", f"{p.seconds:.2f}", f"{s.seconds:.2f}"),
        ("tokens/sec", f"{p.tok_per_s:.2f}", f"{s.tok_per_s:.2f}"),
        ("time to first token", f"{p.ttft_s:.3f}s", f"{s.ttft_s:.3f}s"),
        ("tokens/sec after first", f"{p.decode_tok_per_s:.2f}", f"{s.decode_tok_per_s:.2f}"),
        ("target passes", p.target_passes + 1, s.target_passes + 1),
        ("drafted / accepted", "-", f"{s.drafted} / {s.accepted}"),
        ("acceptance rate", "-", f"{s.acceptance:.1%}"),
        ("accepted per pass", "-", f"{s.mean_accepted_per_pass:.2f} (+1 from target = {s.tokens_per_pass:.2f})"),
        ("acceptance by position", "-", " ".join(f"{a:.2f}" for a in s.acceptance_by_position)),
    ]
    print(f"\n{'':24}{'plain':>12}  speculative ({used.name if used else args.drafter}, {session.precision})")
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
    import gc

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from engine.bench import baseline_plain, read_prompts, run_bench
    from engine.session import Session

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
    session = _session(args)
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


def _human_size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


class _DownloadBar:
    """One terminal line: bar, percent, bytes, rate, ETA and the file being fetched."""

    WIDTH = 28

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.shown = False

    def show(self, done: int, total: int, rate: float, eta: float | None, current: str) -> None:
        frac = done / total if total else 1.0
        filled = int(self.WIDTH * frac)
        eta_text = "--:--" if eta is None else f"{int(eta) // 60:d}:{int(eta) % 60:02d}"
        name = current.rsplit("/", 1)[-1][-24:]
        line = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {frac:4.0%} {_human_size(done)}/{_human_size(total)}"
                f"  {_human_size(rate)}/s  ETA {eta_text}  {name}")
        print(f"\r{line:<100}", end="", file=self.stream, flush=True)
        self.shown = True

    def end(self) -> None:
        if self.shown:
            print(file=self.stream, flush=True)
            self.shown = False


def cmd_download(args) -> int:
    """Fetch a model and its drafter from the Hub. Ctrl-C stops cleanly; running the same
    command again resumes from the bytes already on disk."""
    import signal
    import threading

    from engine.hub import DownloadFailed, DownloadFinished, DownloadProgress, DownloadStarted, download_events, plan_download

    plan = plan_download(args.model, drafter=not args.no_drafter, precision=args.precision,
                         drafter_repo=args.drafter, cross_tokenizer=args.cross_tokenizer, revision=args.revision)
    bar = _DownloadBar()
    print(f"target:  {plan.target.repo} ({len(plan.target.files)} files, {_human_size(plan.target.size)})"
          + (" - installed" if plan.target.installed else ""), file=sys.stderr)
    if plan.drafter is not None:
        where = plan.drafter.repo + (f"/{plan.drafter.subfolder}" if plan.drafter.subfolder else "")
        print(f"drafter: {where} ({plan.drafter_kind}, {plan.drafter_source}; {len(plan.drafter.files)} files,"
              f" {_human_size(plan.drafter.size)})" + (" - installed" if plan.drafter.installed else ""), file=sys.stderr)
    elif not args.no_drafter:
        print(f"drafter: none found ({plan.drafter_kind or 'prompt lookup will be used'})", file=sys.stderr)

    cancel = threading.Event()
    # Ctrl-C sets the cancel flag instead of raising inside the download: it then stops the
    # worker, keeps the partial file for a resume, and reports normally.
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    try:
        for event in download_events(plan, cancel):
            if isinstance(event, DownloadStarted) and 0 < event.bytes_present < event.total_bytes:
                print(f"resuming: {_human_size(event.bytes_present)} of {_human_size(event.total_bytes)} already here", file=sys.stderr)
            elif isinstance(event, DownloadProgress):
                bar.show(event.bytes_done, event.bytes_total, event.rate_bps, event.eta_s, event.current_file)
            elif isinstance(event, DownloadFailed):
                bar.end()
                if event.kind == "cancelled":
                    print("cancelled; run the same command again to resume", file=sys.stderr)
                    return 130
                print(f"tandem: error ({event.kind}): {event.error}", file=sys.stderr)
                return 1
            elif isinstance(event, DownloadFinished):
                bar.end()
                print(f"done in {event.seconds:.1f}s ({_human_size(event.bytes_downloaded)} downloaded)", file=sys.stderr)
                print(f"target: {event.target_path}")
                if event.drafter_path is not None:
                    print(f"drafter: {event.drafter_path}")
                    if event.same_tokenizer is False:
                        print("note: the drafter uses a different tokenizer (cross-tokenizer drafting)", file=sys.stderr)
                return 0
    finally:
        signal.signal(signal.SIGINT, previous)
    return 1
def cmd_models(args) -> int:
    from engine.catalog import load_catalog
    from engine.hardware import Hardware, detect_hardware
    from engine.memory_fit import human_bytes, recommend

    hardware = Hardware.from_profile_file(args.hardware) if args.hardware else detect_hardware()
    results = recommend(load_catalog(), hardware, args.context, precisions=(args.precision,))
    if args.json:
        print(json.dumps({"hardware": hardware.to_dict(), "models": [r.to_dict() for r in results]}, indent=1))
        return 0
    gpus = ", ".join(f"{g.name} {human_bytes(g.free_bytes)} free" for g in hardware.gpus) or "no CUDA GPU"
    unified = f", unified memory {human_bytes(hardware.unified_memory)}" if hardware.unified_memory else ""
    print(f"{hardware.cpu_model}: RAM {human_bytes(hardware.ram_available)} free of {human_bytes(hardware.ram_total)}"
          f"{unified}; {gpus}" + (f"; disk {human_bytes(hardware.disk_free)} free" if hardware.disk_free is not None else ""))
    print(f"\n   {'model':<21}{'drafter':<13}{'prec':<6}{'context':>8}{'needs':>10}  {'fit':<8}{'speedup':<11}reason")
    for r in results:
        speedup = f"{r.predicted_speedup[0]:.1f}-{r.predicted_speedup[1]:.1f}x"
        print(f"{'*' if r.recommended else ' '}  {r.entry.id:<21}{r.entry.drafter_kind:<13}{r.precision:<6}{r.context:>8}"
              f"{human_bytes(r.estimate.total):>10}  {r.fit:<8}{speedup:<11}{r.reason}")
    best = next((r for r in results if r.recommended), None)
    if best:
        print(f"\nrecommended: {best.entry.name} with {best.entry.drafter_repo or best.entry.drafter_kind}, "
              f"{best.precision} on {best.device}, context {best.context}")
    else:
        print("\nnothing in the catalog fits this machine")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description="Lossless speculative decoding for local models")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_options(p):
        p.add_argument("--precision", choices=["exact", "fast", "int8", "int4"], default="fast",
                       help="exact: fp32, greedy output token-identical; fast: bf16; int8 / int4: the target's weights"
                            " quantized (smaller, faster on a CPU, output different from bf16; int8 layers round their inputs"
                            " to int16, int4 ones to int8 as llama.cpp's Q4 formats do, and int4 changes the model"
                            " more; speculation stays"
                            " token-identical to plain decoding of the quantized target)")
        p.add_argument("--target", help="model folder (default: the offline Qwen2.5-Coder 1.5B)")
        p.add_argument("--drafter-model", help="draft model folder, or a Gemma 4 -assistant folder for a Gemma 4"
                                               " target (default: Qwen2.5-Coder 0.5B)")
        p.add_argument("--drafter", choices=["model", "lookup", "mtp"], default="model",
                       help="model: --drafter-model (a draft model or Gemma 4 assistant); lookup: prompt lookup;"
                            " mtp: the target's own MTP layers (prompt lookup when it has none)")
        p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
        p.add_argument("--max-new-tokens", type=int, default=128)
        p.add_argument("--drafter-head", choices=["pruned", "full"], default="pruned",
                       help="draft from a reduced LM head (frequent tokens + the request's own) or the full vocabulary")
        p.add_argument("--drafter-precision", choices=["auto", "int8", "int4", "bf16", "fp32"], default="auto",
                       help="drafter weights; auto: int8 where the fast CPU kernel runs, int4 next to an int8 / int4 "
                            "target (never changes the output)")
        p.add_argument("--draft-vocab-size", type=int, default=DEFAULT_DRAFT_VOCAB,
                       help="tokens kept by the pruned drafter head")
        p.add_argument("--min-confidence", type=float, default=DEFAULT_MIN_CONFIDENCE,
                       help="stop a draft once the drafter's probability of its next token is below this")
        p.add_argument("--no-lookup", action="store_true",
                       help="draft with the model alone (default: prompt lookup drafts where the text copies the prompt)")

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
    p.add_argument("--repeats", type=int, default=1,
                   help="time plain and speculative decoding of each prompt this many times, alternating, "
                        "and report the median run of each (for noisy, shared machines)")
    p.add_argument("--baseline-precision", choices=["exact", "fast", "int8", "int4"],
                   help="also time plain decoding of the same prompts at this precision, in the same run (e.g."
                        " --precision int8 --baseline-precision fast: what quantizing the target buys)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    model_options(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("download", help="fetch a model and its matching drafter from the Hugging Face Hub")
    p.add_argument("model", metavar="REPO_OR_CATALOG_ID")
    p.add_argument("--no-drafter", action="store_true", help="fetch the target only")
    p.add_argument("--drafter", metavar="REPO", help="use this drafter repo instead of the catalog pairing")
    p.add_argument("--cross-tokenizer", action="store_true",
                   help="accept a drafter whose tokenizer differs from the target's")
    p.add_argument("--precision", default=None, metavar="VARIANT",
                   help="weight variant: default the repo's own safetensors; e.g. fp16, or a GGUF quant like Q4_K_M")
    p.add_argument("--revision", default="main", help="branch, tag or commit of the target (default: main)")
    p.set_defaults(func=cmd_download)
    p = sub.add_parser("models", help="the model catalog with memory fit and a recommendation for this machine")
    p.add_argument("--context", type=int, default=None, help="context length in tokens (default: the longest that fits)")
    p.add_argument("--precision", default="bf16", help="bf16 (fast, default), fp32 (exact), fp16, int8, int4")
    p.add_argument("--hardware", metavar="PROFILE.json",
                   help="plan for a described machine: JSON with ram_gb, gpus [{name, vram_gb}], unified_memory_gb, disk_free_gb")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_models)
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
