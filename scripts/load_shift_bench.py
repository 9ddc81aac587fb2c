"""Speculation when the machine's load changes between requests and during one.

    .venv/bin/python scripts/load_shift_bench.py [--threads-busy 2] [--max-new-tokens 96] [--json out.json]

The draft-length controller seeds each request with the costs the previous one measured. A
request that ran while other work took the cores measures dear drafting; the quiet requests
after it must not inherit that verdict. Three phases on the default pair (GGUF file, draft
model, greedy), each prompt run plain and speculative in the same conditions:

1. busy: the first code prompt beside ``--threads-busy`` spinning threads;
2. quiet: the remaining code prompts with the load stopped;
3. load arrives: a busy phase again after quiet requests.

Prints per request: decode tok/s plain and speculative (after the first token), the speedup,
acceptance, how many target passes ran with speculation switched off, and the threads the
speculative run used (``--fixed-threads`` keeps torch's count: the controller alone adapts).
"""
from __future__ import annotations

import argparse
import json

from engine.bench.background_load import BackgroundLoad
from engine.bench.prompt_sets import read_prompts, select_prompts
from engine.bench.summary import geomean
from engine.core.paths import RESOURCES
from engine.core.settings import DecodeSettings
from engine.core.threads import ThreadPolicy
from engine.models.loading import default_pair
from engine.session.compare import drain, warm_up
from engine.session.session import Session
from kernels import cpu_kernel_report


def _pair(session: Session, prompt: dict, settings: DecodeSettings, phase: str) -> dict:
    ids = session.encode(prompt["prompt"])
    session.forget_prefixes()
    plain = drain(session.plain(ids, settings))
    session.forget_prefixes()
    spec = drain(session.speculative(ids, settings, "model"))
    p, s = plain.stats.decode_tok_per_s, spec.stats.decode_tok_per_s
    row = {"phase": phase, "prompt": prompt["id"], "plain_tok_s": round(p, 2), "speculative_tok_s": round(s, 2),
           "speedup": round(s / p, 3) if p else None, "acceptance": round(spec.stats.acceptance, 3),
           "passes": spec.stats.target_passes, "off_passes": spec.stats.speculation_off_steps,
           "identical": plain.token_ids == spec.token_ids, "threads": session.threads.describe_last()}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads-busy", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--fixed-threads", action="store_true",
                        help="keep torch's threads whatever the load (the draft-length controller alone adapts)")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    paths = default_pair.installed_paths()
    if paths is None:
        raise SystemExit("the default pair is not installed: run `make setup`")
    print(f"CPU tiles: {cpu_kernel_report()}")
    session = Session.load(default_pair.gguf_file(default_pair.TARGET), paths[1], precision="file")
    if args.fixed_threads:
        session.threads = ThreadPolicy(adaptive=False)
    warm_up(session)
    prompts = select_prompts(read_prompts(RESOURCES / "prompts" / "bench.jsonl"), ["code"])
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens)
    rows = []
    with BackgroundLoad(threads=args.threads_busy):
        rows.append(_pair(session, prompts[0], settings, "busy"))
    for prompt in prompts[1:]:
        rows.append(_pair(session, prompt, settings, "quiet"))
    with BackgroundLoad(threads=args.threads_busy):
        rows.append(_pair(session, prompts[0], settings, "busy again"))
    for phase in ("busy", "quiet", "busy again"):
        speedups = [r["speedup"] for r in rows if r["phase"] == phase and r["speedup"]]
        off = sum(r["off_passes"] for r in rows if r["phase"] == phase)
        passes = sum(r["passes"] for r in rows if r["phase"] == phase)
        print(f"{phase}: speedup {geomean(speedups):.2f}x over {len(speedups)} prompts, {off} of {passes} passes off")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
