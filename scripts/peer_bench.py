"""Tandem against llama.cpp on the same GGUF files, in one run, alternating prompt by prompt.

    python scripts/peer_bench.py --llama-cpp /tmp/peer/build [--draft-max 3 5 8] [--repeats 1]
        [--category code ...] [--limit N] [--no-int4] [--json docs/benchmarks/FILE.json]
        [--mode sample --temperature 0.7 --seeds 0,1]
        [model options of `tandem bench`; default: the default pair's GGUF target, --precision file]

llama.cpp (its llama-bench and llama-speculative-simple, built apart: see
engine/bench/llamacpp.BUILD_HINT, printed when they are missing) is a benchmark peer only.

For every prompt, in this order: Tandem's plain and speculative decoding of the prompt
(engine.bench.suite.run_bench, as `tandem bench` runs it), then llama.cpp's plain decode rate
(llama-bench -p 0 -n N) and its draft-model speculation on the same chat-formatted prompt at each
--draft-max: a load drift in the shared machine slows both sides alike. With --mode sample both
engines sample at --temperature alone (no top-k / top-p / min-p cut) at every seed of --seeds:
Tandem's plain and speculative runs as `tandem bench --mode sample` times them, llama.cpp's
speculation once per seed (geometric means over seeds, as Tandem's rows); llama-bench's plain
rate does not sample (what sampling costs a token is small beside a step). Then, for reference,
Tandem's int4 precision on the converted target, each prompt followed by one more llama-bench
run. All figures are decode rates (tokens over the time after the prompt's prefill), both threads
counts the same (--threads, default 2; Tandem gives threads up to cores other programs keep busy
unless --fixed-threads, llama.cpp keeps its -t). --background-load / --memory-pressure / --memory-left run both
engines beside busy threads or held RAM, started once the models are loaded.
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.bench import llamacpp  # noqa: E402  (no torch: the missing-binaries hint comes in milliseconds)


def parse_args(argv=None) -> argparse.Namespace:
    from engine.bench.background_load import add_load_options, load_from_args
    from engine.cli.common import model_options
    from engine.core.paths import RESOURCES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_BUILD"),
                   help="llama.cpp build folder holding bin/llama-bench and bin/llama-speculative-simple (default: $LLAMA_CPP_BUILD)")
    p.add_argument("--draft-max", type=int, nargs="+", default=[3, 5, 8], help="llama.cpp's --spec-draft-n-max settings to try (0: none; its"
                   " speculative binary allocates a second model's buffers, which --memory-left may not leave room for)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each measurement per prompt (medians reported)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for both engines")
    p.add_argument("--prompts", default=str(RESOURCES / "prompts" / "bench.jsonl"))
    p.add_argument("--category", action="append", help="only prompts of this category (repeatable)")
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    p.add_argument("--int4-target", help="converted target folder for the int4 reference (default: the default pair's)")
    p.add_argument("--no-int4", action="store_true", help="skip the int4 reference")
    p.add_argument("--omp-wait-policy", choices=["passive", "active", "unset"], default="unset",
                   help="OMP_WAIT_POLICY for both engines (both run on OpenMP threads). Default: unset, each engine"
                        " as a user runs it (its threads spin a while between operations); passive waiting cost both"
                        " ~40%% of their decode rate on a quiet machine (same run), but on one whose cores are"
                        " oversubscribed spin-waiting threads make a 2-thread decode several times slower")
    p.add_argument("--no-repack", action="store_true",
                   help="run llama.cpp without its weight repacking (--repack 0 / --no-repack). On a CPU with AMX its"
                        " repacked AMX path is what runs; on a VM that exposes AMX its speculative binary crashed there"
                        " (SIGSEGV in ggml_backend_amx_mul_mat) and its plain decode ran slower than without repacking")
    add_load_options(p, "while both engines run")
    p.add_argument("--mode", choices=["greedy", "sample"], default="greedy",
                   help="greedy (the default) or sample: both engines at --temperature, every seed of --seeds")
    p.add_argument("--temperature", type=float, default=0.7, help="with --mode sample (default 0.7)")
    p.add_argument("--seeds", default="2", help="with --mode sample: N (seeds 0 to N-1) or S1,S2,... (default 2)")
    p.add_argument("--json", default="peer-llamacpp.json")
    model_options(p)
    p.set_defaults(precision="file", max_new_tokens=96)
    args = p.parse_args(argv)
    try:
        load_from_args(args)  # a bad value refused now, not after the models load
    except ValueError as e:
        p.error(str(e))
    args.draft_max = [n for n in args.draft_max if n]
    if args.mode == "sample":
        from engine.cli.bench import parse_seeds
        from engine.core.settings import DecodeSettings, InvalidRequest

        try:
            args.seeds = parse_seeds(args.seeds)
            DecodeSettings(mode="sample", temperature=args.temperature, max_new_tokens=args.max_new_tokens)
        except InvalidRequest as e:
            p.error(str(e))
    else:
        args.seeds = []
    return args


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def median_by(runs: list, key: str):
    ranked = sorted(runs, key=lambda r: getattr(r, key))
    return ranked[(len(ranked) - 1) // 2]


def chat_text(session, prompt: str) -> str:
    """The prompt as Tandem's session feeds it (the chat template, generation prompt added), as
    text: llama.cpp tokenizes it with special tokens parsed, so both start from the same ids."""
    return session.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)


class Peer:
    """llama.cpp's runs for each prompt Tandem has just finished, kept by prompt id."""

    def __init__(self, binaries, target: Path, drafter: Path, args):
        self.binaries, self.target, self.drafter, self.args = binaries, target, drafter, args
        self.rows: dict[str, dict] = {}

    def plain(self) -> dict:
        faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_majflt  # llama-bench's reads of its file from disk
        run, _ = llamacpp.run_plain(self.binaries, self.target, self.args.max_new_tokens, self.args.threads, self.args.repeats,
                                    repack=not self.args.no_repack)
        faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_majflt - faults
        return {"tok_per_s": run.tok_per_s, "major_faults": faults, "samples": list(run.samples_tok_per_s), "stddev": run.stddev_tok_per_s,
                "cpu_info": run.cpu_info, "build_commit": run.build_commit, "build_number": run.build_number,
                "model_type": run.model_type}

    def speculative(self, text: str) -> dict:
        """llama-speculative-simple at each --draft-max: greedy, or sampled once per seed (rates
        and acceptance then the geometric / plain means over the seeds, as Tandem's sampled rows)."""
        from engine.bench.summary import geomean

        sampled = self.args.mode == "sample"
        by_setting = {}
        for n in self.args.draft_max:
            per_seed = []
            for seed in self.args.seeds if sampled else [0]:
                runs = [llamacpp.run_speculative(self.binaries, self.target, self.drafter, text, n, self.args.max_new_tokens,
                                                 self.args.threads, repack=not self.args.no_repack,
                                                 temperature=self.args.temperature if sampled else 0.0, seed=seed)[0]
                        for _ in range(self.args.repeats)]
                per_seed.append((seed, median_by(runs, "decode_tok_per_s"), runs))
            drafted, accepted = sum(b.drafted for _, b, _ in per_seed), sum(b.accepted for _, b, _ in per_seed)
            row = {"decode_tok_per_s": geomean([b.decode_tok_per_s for _, b, _ in per_seed]),
                   "runs": [r.decode_tok_per_s for _, _, runs in per_seed for r in runs],
                   "decoded_tokens": sum(b.decoded_tokens for _, b, _ in per_seed), "prompt_tokens": per_seed[0][1].prompt_tokens,
                   "acceptance": accepted / drafted if drafted else 0.0, "drafted": drafted, "accepted": accepted}
            if sampled:
                row["seeds"] = [{"seed": seed, "decode_tok_per_s": b.decode_tok_per_s, "acceptance": b.acceptance,
                                 "decoded_tokens": b.decoded_tokens} for seed, b, _ in per_seed]
            by_setting[str(n)] = row
        return by_setting

    def after_prompt(self, session, prompts: dict, with_speculation: bool):
        """run_bench's on_report: called after each prompt (and once more, complete, at the end)."""
        def on_report(report: dict) -> None:
            if report["complete"]:
                return
            row = report["prompts"][-1]
            peer = {"plain": self.plain()}
            if with_speculation:
                peer["speculative"] = self.speculative(chat_text(session, prompts[row["id"]]["prompt"]))
            self.rows[row["id"]] = peer
            spec = peer.get("speculative", {})
            faults = f" ({peer['plain']['major_faults']} disk page faults)" if peer["plain"]["major_faults"] else ""
            print(f"{'':<14} llama.cpp plain {peer['plain']['tok_per_s']:5.2f} tok/s{faults}"
                  + "".join(f"  spec@{n} {s['decode_tok_per_s']:5.2f} (acc {s['acceptance']:.2f})" for n, s in spec.items())
                  + f"  load {load_average()[0]:.2f}", flush=True)
        return on_report


def tandem_phase(session, prompts: list[dict], peer: Peer, args, with_speculation: bool) -> tuple[dict, dict]:
    from engine.bench.suite import run_bench

    peer.rows = {}
    sampling = {"mode": "sample", "temperature": args.temperature, "seeds": args.seeds} if args.mode == "sample" else {}
    report = run_bench(session, prompts, args.max_new_tokens, args.drafter, hf=False, agreement=False, repeats=args.repeats,
                       on_report=peer.after_prompt(session, {p["id"]: p for p in prompts}, with_speculation), **sampling)
    return report, dict(peer.rows)


def summarize(report: dict, peer_rows: dict, draft_max: list[int]) -> dict:
    """Per category and overall (geometric means over prompts) of decode rates, Tandem's and
    llama.cpp's, and the ratios the goals speak of."""
    from engine.bench.summary import geomean

    def of(rows, fn):
        return geomean([fn(r) for r in rows])

    rows = [r for r in report["prompts"] if r["id"] in peer_rows]
    llama_plain = lambda r: peer_rows[r["id"]]["plain"]["tok_per_s"]  # noqa: E731
    groups = {"all": rows, **{c: [r for r in rows if r["category"] == c] for c in sorted({r["category"] for r in rows})}}
    out = {}
    for name, group in groups.items():
        s = {"prompts": len(group),
             "tandem_plain_decode_tok_per_s": of(group, lambda r: r["plain"]["decode_tok_per_s"]),
             "tandem_speculative_decode_tok_per_s": of(group, lambda r: r["speculative"]["decode_tok_per_s"]),
             "tandem_speculative_vs_plain": of(group, lambda r: r["decode_speedup_vs_plain"]),
             "tandem_speculative_vs_plain_min": min(r["decode_speedup_vs_plain"] for r in group),
             "llamacpp_plain_tok_per_s": of(group, llama_plain),
             # Per prompt against the llama-bench run right after it, then the geometric mean.
             "tandem_plain_vs_llamacpp_plain": of(group, lambda r: r["plain"]["decode_tok_per_s"] / llama_plain(r)),
             "tandem_speculative_vs_llamacpp_plain": of(group, lambda r: r["speculative"]["decode_tok_per_s"] / llama_plain(r))}
        if all("speculative" in peer_rows[r["id"]] for r in group):
            settings = {n: of(group, lambda r, n=n: peer_rows[r["id"]]["speculative"][str(n)]["decode_tok_per_s"]) for n in draft_max}
            best = max(settings, key=settings.get)
            s.update(llamacpp_speculative_decode_tok_per_s=settings, llamacpp_best_draft_max=best,
                     llamacpp_best_speculative_decode_tok_per_s=settings[best],
                     llamacpp_best_speculative_vs_plain=of(group, lambda r: peer_rows[r["id"]]["speculative"][str(best)]["decode_tok_per_s"] / llama_plain(r)),
                     tandem_speculative_vs_llamacpp_best_speculative=of(
                         group, lambda r: r["speculative"]["decode_tok_per_s"] / peer_rows[r["id"]]["speculative"][str(best)]["decode_tok_per_s"]))
        out[name] = s
    return out


def goals(file_summary: dict) -> dict:
    """The targets set for the record, each with its figure and whether it is met."""
    overall, code = file_summary["all"], file_summary.get("code")
    found = {"tandem_plain_vs_llamacpp_plain >= 1.0": overall["tandem_plain_vs_llamacpp_plain"],
             "tandem_speculative_vs_plain_min_any_prompt >= 0.95": overall["tandem_speculative_vs_plain_min"]}
    if code:
        found["tandem_speculative_vs_plain_code >= 1.6"] = code["tandem_speculative_vs_plain"]
        found["tandem_speculative_code_vs_llamacpp_plain >= 1.5"] = code["tandem_speculative_vs_llamacpp_plain"]
    return {name: {"value": round(v, 3), "met": v >= float(name.rsplit(">= ", 1)[1])} for name, v in found.items()}


def print_summary(name: str, summary: dict) -> None:
    for cat, s in summary.items():
        line = (f"  {name:<5} {cat:<8} Tandem plain {s['tandem_plain_decode_tok_per_s']:6.2f}  spec {s['tandem_speculative_decode_tok_per_s']:6.2f}"
                f" ({s['tandem_speculative_vs_plain']:.2f}x, min {s['tandem_speculative_vs_plain_min']:.2f}x)"
                f"  llama.cpp plain {s['llamacpp_plain_tok_per_s']:6.2f}  Tandem plain / llama plain {s['tandem_plain_vs_llamacpp_plain']:.2f}x"
                f"  Tandem spec / llama plain {s['tandem_speculative_vs_llamacpp_plain']:.2f}x")
        if "llamacpp_best_draft_max" in s:
            line += (f"  llama spec best (n_max {s['llamacpp_best_draft_max']}) {s['llamacpp_best_speculative_decode_tok_per_s']:6.2f}"
                     f" ({s['llamacpp_best_speculative_vs_plain']:.2f}x its plain); Tandem spec / llama best spec"
                     f" {s['tandem_speculative_vs_llamacpp_best_speculative']:.2f}x")
        print(line)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        binaries = llamacpp.find_binaries(args.llama_cpp)
    except llamacpp.PeerMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.omp_wait_policy != "unset":  # before torch starts its OpenMP threads
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
        llamacpp.PEER_ENV["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    else:
        llamacpp.PEER_ENV.pop("OMP_WAIT_POLICY", None)
    import torch

    from engine.bench.background_load import load_from_args
    from engine.bench.prompt_sets import read_prompts, select_prompts
    from engine.cli.common import drafter_options, load_session, write_json_atomically
    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair
    from engine.models.planning.hardware import cpu_model
    from kernels import cpu_kernel_report
    from kernels.gguf_linear import backend_name

    gguf_dir = cache_dir() / "gguf"
    args.target = args.target or str(gguf_dir / default_pair.TARGET.filename)
    # Tandem's drafter is the default pair's converted folder (as `tandem` runs it: its int4 /
    # int8 weights are built from it); llama.cpp's, the drafter's GGUF file.
    args.drafter_model = args.drafter_model or str(default_pair.prepare(default_pair.DRAFTER))
    peer_drafter = gguf_dir / default_pair.DRAFTER.filename
    for path in (Path(args.target), peer_drafter):
        if not path.is_file():
            print(f"{path} is missing: `tandem models` (or any run of the default pair) assembles it", file=sys.stderr)
            return 2
    prompts = select_prompts(read_prompts(Path(args.prompts)), args.category, args.limit)
    out = Path(args.json)
    torch.set_num_threads(args.threads)
    record = {"what": "Tandem against llama.cpp on the same GGUF files, one run, alternating prompt by prompt",
              "cpu": cpu_model(), "threads": args.threads, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "draft_max": args.draft_max, "mode": args.mode, "temperature": args.temperature if args.seeds else None,
              "seeds": args.seeds or None, "llamacpp_repack": not args.no_repack, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "load_average_before": load_average(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "notes": ["decode rates: Tandem's counts the tokens after the first over the time after it; llama-speculative-simple's"
                        " counts every generated token from the pass after the prompt's prefill; llama-bench's tg is decoding from an empty"
                        " context (-p 0 -n N)"]}
    print(f"load average before: {record['load_average_before']}", flush=True)
    info, _ = llamacpp.run_system_info(binaries, args.threads)
    record["llamacpp"] = {"build_dir": str(args.llama_cpp), "system_info": info["line"], "cpu_features": info["features"],
                          "target": args.target, "drafter": str(peer_drafter), "environment": llamacpp.PEER_ENV}
    print(f"llama.cpp: {info['line']}", flush=True)

    drafter_options(args)
    session = load_session(args)
    record["tandem_kernels"] = {"report": cpu_kernel_report(), "gguf_linear": backend_name()}
    print(f"Tandem kernels: {record['tandem_kernels']['report']}", flush=True)
    peer = Peer(binaries, Path(args.target), peer_drafter, args)
    # The same load for both engines: started after the models load, stopped after the last run.
    load = load_from_args(args)
    with load:
        file_report, file_peer = tandem_phase(session, prompts, peer, args, with_speculation=bool(args.draft_max))
        record["background_load"] = load.describe() if load.active else None
        load_text = load.text()
    record["file"] = {"tandem": file_report, "llamacpp": file_peer, "summary": summarize(file_report, file_peer, args.draft_max)}
    record["goals"] = goals(record["file"]["summary"])
    write_json_atomically(out, record)
    del session
    gc.collect()

    if not args.no_int4:
        args.target = args.int4_target or str(default_pair.prepare(default_pair.TARGET))
        args.precision = "int4"
        session = load_session(args)
        with load_from_args(args):
            int4_report, int4_peer = tandem_phase(session, prompts, peer, args, with_speculation=False)
        record["int4"] = {"tandem": int4_report, "llamacpp": int4_peer, "summary": summarize(int4_report, int4_peer, args.draft_max)}
        del session
        gc.collect()

    record["load_average_after"] = load_average()
    write_json_atomically(out, record)
    if record.get("background_load"):
        print(f"background load while both ran: {load_text}\n  {record['background_load']}")
    print(f"\nCPU {record['cpu']}, {args.threads} threads; load average before {record['load_average_before']}, after {record['load_average_after']}")
    print(f"llama.cpp CPU features: {' '.join(record['llamacpp']['cpu_features'])}")
    print(f"Tandem kernels: {record['tandem_kernels']['report']}")
    print_summary("file", record["file"]["summary"])
    if "int4" in record:
        print_summary("int4", record["int4"]["summary"])
    for name, g in record["goals"].items():
        print(f"  goal {name}: {g['value']:.2f} {'met' if g['met'] else 'MISSED'}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
