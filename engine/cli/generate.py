"""`tandem setup` (the default offline pair, ready) and `tandem compare` (one prompt, with and
without speculation, compared honestly)."""
from __future__ import annotations

import itertools
import sys

from engine.cli.common import default_model_paths, load_session, model_options


def run_setup(args) -> int:
    """Build what is missing, and verify everything it then calls ready: every file of both
    converted models is hashed against its digest, and the int8 / int4 weight caches of both
    models, where present, against theirs (a damaged model is converted again, a damaged cache
    removed for the next load to rebuild, each with a warning)."""
    from engine.models.loading import default_pair
    from engine.models.loading.file_precision import label_for
    from engine.quant import weight_cache
    from kernels import cpu_kernel_report

    # Every precision's files: the converted folders (bf16 / fp32 / int8 / int4 start from them)
    # and the target's GGUF file ("file", the default).
    target, drafter = default_model_paths(None, None, full_check=True, precision="bf16")
    gguf = default_pair.gguf_file(default_pair.TARGET)
    for (model, role), kind in itertools.product(((target, "target"), (drafter, "drafter")), weight_cache.KINDS):
        state = weight_cache.check(model, kind, role)
        if state.status == "verified":  # a damaged one was removed with a warning saying why
            print(f"{kind}{' drafter' if role == 'drafter' else ''} weight cache verified: {state.path}")
    # Compiles them once, now, rather than on the first request (or inside a timed test).
    print("CPU kernels:", cpu_kernel_report())
    print("default model pair verified and ready:", target, drafter, sep="\n  ")
    print(f"default precision: {default_pair.DEFAULT_PRECISION} ({label_for(default_pair.DEFAULT_PRECISION, gguf)}), from {gguf}")
    return 0


def run_compare(args) -> int:
    from engine.core.settings import DecodeSettings, check_prompt
    from engine.session.compare import compare

    # Everything a user can get wrong is checked before the models load (a minute, the first time).
    settings = DecodeSettings(mode=args.mode, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_new_tokens=args.max_new_tokens, seed=args.seed, draft_length=args.draft_length)
    check_prompt(args.prompt)
    session = load_session(args, need_drafter=args.drafter == "model")
    used = session.drafter(args.drafter)
    if session.drafter_note:
        print(f"note: {session.drafter_note}", file=sys.stderr)
    against = "draft_model" if args.race_with else "off"
    result = compare(session, args.prompt, settings, args.drafter, on_event=_prefill_progress(), against=against)
    p, s = result.plain.stats, result.speculative.stats
    first = session.drafter(against).name if args.race_with else None
    print(f"=== {'with ' + first if first else 'without speculation'} ===\n" + result.plain.text)
    print("=== with speculation ===\n" + result.speculative.text)
    rows = [
        ("new tokens", p.new_tokens, s.new_tokens),
        ("seconds", f"{p.seconds:.2f}", f"{s.seconds:.2f}"),
        ("tokens/sec", f"{p.tok_per_s:.2f}", f"{s.tok_per_s:.2f}"),
        ("prompt tokens", p.prompt_tokens, s.prompt_tokens),
        ("time to first token", f"{p.ttft_s:.3f}s", f"{s.ttft_s:.3f}s"),
        ("tokens/sec after first", f"{p.decode_tok_per_s:.2f}", f"{s.decode_tok_per_s:.2f}"),
        ("target passes", p.target_passes + 1, s.target_passes + 1),
        ("drafted / accepted", _drafted(p), f"{s.drafted} / {s.accepted}"),
        ("acceptance rate", f"{p.acceptance:.1%}" if p.drafted else "-", f"{s.acceptance:.1%}"),
        ("accepted per pass", f"{p.mean_accepted_per_pass:.2f}" if p.drafted else "-",
         f"{s.mean_accepted_per_pass:.2f} (+1 from target = {s.tokens_per_pass:.2f})"),
        ("acceptance by position", " ".join(f"{a:.2f}" for a in p.acceptance_by_position) or "-",
         " ".join(f"{a:.2f}" for a in s.acceptance_by_position)),
    ]
    print(f"\n{'':24}{'draft model' if first else 'plain':>12}  speculative ({used.name if used else args.drafter},"
          f" {session.precision})")
    for name, a, b in rows:
        print(f"{name:<24}{str(a):>12}  {b}")
    over = f" over {first}" if first else ""
    print(f"speedup{over}: {result.speedup:.2f}x (after the first token: {result.decode_speedup:.2f}x)")
    print(f"warm-up: both lanes ran a few tokens untimed first ({result.warm_up_seconds:.2f} s), so neither is"
          " timed with the process's one-time costs")
    print(f"threads: {'draft model' if first else 'plain'} {result.plain_threads}; speculative {result.speculative_threads}")
    if result.identical:
        print("outputs: identical")
    elif result.divergence:
        d = result.divergence
        print(f"outputs: differ from new token {d.position} (target's top-2 logit gap there: {d.top2_gap:.4f};"
              " a near-tie that batched verification rounds differently in bf16)")
    else:
        print("outputs: differ (sampling: both are valid draws from the same distribution)")
    return 0


def _drafted(stats) -> str:
    return f"{stats.drafted} / {stats.accepted}" if stats.drafted else "-"


def _prefill_progress():
    """compare's on_event: a long prompt's prefill, chunk by chunk, on one stderr line (ended
    when the first token comes)."""
    from engine.core.events import Stats

    shown: set[str] = set()

    def on_event(lane: str, event) -> None:
        if isinstance(event, Stats) and event.stats.new_tokens == 0 and event.stats.prompt_tokens:
            st = event.stats
            print(f"\r{lane}: reading the prompt, {st.prompt_done:,} of {st.prompt_tokens:,} tokens", end="",
                  file=sys.stderr, flush=True)
            shown.add(lane)
        elif lane in shown:
            shown.discard(lane)
            print(file=sys.stderr, flush=True)
    return on_event


def add_parsers(sub) -> None:
    p = sub.add_parser("setup", help="assemble, verify and convert the default offline model pair")
    p.set_defaults(func=run_setup)

    p = sub.add_parser("compare", help="run a prompt with and without speculation")
    p.add_argument("prompt")
    p.add_argument("--mode", choices=["greedy", "sample"], default="greedy")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft-length", type=int, default=None, help="fixed k (default: adaptive)")
    p.add_argument("--race-with", metavar="DRAFT_MODEL",
                   help="race the drafter made for the target (--drafter-model: EAGLE-3 / DFlash, one `tandem distill`"
                        " made) against this draft model (a folder or .gguf file): the first run speculates with it"
                        " instead of decoding plainly")
    model_options(p)
    p.set_defaults(func=run_compare)
