"""Benchmark: our plain and speculative decoding next to transformers' own generate, same run.

For every prompt, in this order: our plain, our speculative, transformers' plain generate and
transformers' generate with ``assistant_model``. All greedy on the same prompt ids, so their
outputs can be compared token for token.

``mode="sample"`` times what users run instead (the server samples at T=1.0 by default): each
prompt at several seeds, plain and speculative alternating at each, one row per seed under the
prompt's row, and the geometric mean over every (prompt, seed) pair with its spread. Sampled
outputs are not compared across the two (both are draws from the same distribution); the same
seed run twice must give the same output. transformers' references are greedy only.

``baseline_plain`` times plain decoding of the same prompts by another session (the bf16 target
when the bench runs an int8 one), so one run shows what quantizing the target buys on its own.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace

import torch

from engine.bench.draft_agreement import draft_agreement, full_head_like
from engine.bench.step_costs import measure_step_costs
from engine.bench.summary import add_counts, by_position, geomean, spread, summarize
from engine.core.events import Tokens
from engine.core.settings import DecodeSettings, InvalidRequest
from engine.decode.divergence import first_difference
from engine.drafters import DraftModelDrafter
from engine.session.compare import drain, warm_up
from engine.session.session import DrafterKind, Session

log = logging.getLogger(__name__)


class _PositionCounts:
    """Per draft position, over a run's steps: how often it was drafted and accepted (counts,
    so runs pool into one acceptance-by-position; RunStats holds the ratios only)."""

    def __init__(self) -> None:
        self.drafted: list[int] = []
        self.accepted: list[int] = []

    def __call__(self, event) -> None:
        if isinstance(event, Tokens) and event.drafted:
            while len(self.drafted) < event.drafted:
                self.drafted.append(0)
                self.accepted.append(0)
            for i in range(event.drafted):
                self.drafted[i] += 1
                self.accepted[i] += i < event.accepted


def _ours(events) -> dict:
    counts = _PositionCounts()
    result = drain(events, counts)
    s = result.stats
    return {
        "new_tokens": s.new_tokens,
        "seconds": s.seconds,
        "tok_per_s": s.tok_per_s,
        "decode_tok_per_s": s.decode_tok_per_s,
        "ttft_s": s.ttft_s,
        "token_ids": list(result.token_ids),
        "drafted_at": counts.drafted,
        "accepted_at": counts.accepted,
        "stats": asdict(s),
    }


def _speculative(session: Session, ids: list[int], settings: DecodeSettings, drafter: DrafterKind) -> dict:
    spec = _ours(session.speculative(ids, settings, drafter))
    s = spec["stats"]
    spec.update(drafted=s["drafted"], accepted=s["accepted"], acceptance=s["acceptance"], mean_accepted_per_pass=s["mean_accepted_per_pass"], tokens_per_pass=s["tokens_per_pass"],
                acceptance_by_position=by_position(spec["drafted_at"], spec["accepted_at"]))
    used = session.drafter(drafter)
    if hasattr(used, "lookup_steps"):  # which source drafted each pass (LookupFirstDrafter)
        spec.update(lookup_steps=used.lookup_steps, model_steps=used.model_steps)
    return spec


def _median_run(runs: list[dict]) -> dict:
    """The run of median speed (the lower middle one of an even count), with every run's speed;
    its decode rate the median of the runs' decode rates, taken apart. Why apart: on a long
    prompt the prefill is most of a run's time, so the run of median speed is one of median
    prefill, and its decode rate any of the runs' (a 4k-token prompt's three plain runs decoded
    at 46, 48 and 38 ms a token; the run of median speed was the 48)."""
    ranked = sorted(runs, key=lambda r: r["tok_per_s"])
    return {**ranked[(len(ranked) - 1) // 2], "tok_per_s_runs": [r["tok_per_s"] for r in runs],
            "decode_tok_per_s": statistics.median_low([r["decode_tok_per_s"] for r in runs]),
            "decode_tok_per_s_runs": [r["decode_tok_per_s"] for r in runs]}


@torch.inference_mode()
def _hf(session: Session, prompt_ids: list[int], max_new_tokens: int, assisted: bool) -> dict:
    model = session.target.model
    input_ids = torch.tensor([prompt_ids], device=session.target.device)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=session.tokenizer.pad_token_id or 0)
    if assisted:
        kwargs["assistant_model"] = session.drafter_model.model
    start = time.perf_counter()
    out = model.generate(input_ids, **kwargs)
    seconds = time.perf_counter() - start
    new = out[0, len(prompt_ids):].tolist()
    while new and new[-1] in session.eos_ids:  # our runs do not count EOS as a new token
        new.pop()
    return {"new_tokens": len(new), "seconds": seconds, "tok_per_s": len(new) / seconds, "token_ids": new}


def baseline_plain(session: Session, prompts: list[dict], max_new_tokens: int, progress=print) -> dict:
    """Plain greedy decoding of ``prompts`` by ``session`` (e.g. the bf16 target, for an int8
    bench): {"precision", "prompts": {id: {"tok_per_s", "new_tokens", "token_ids"}}}."""
    settings = DecodeSettings(max_new_tokens=max_new_tokens)
    # Untimed, as run_bench's warm-up: the first prompt's own length, so no one-time cost is timed.
    drain(session.plain(session.encode(prompts[0]["prompt"]), DecodeSettings(max_new_tokens=WARM_UP_TOKENS)))
    rows = {}
    for item in prompts:
        session.forget_prefixes()
        run = _ours(session.plain(session.encode(item["prompt"]), settings))
        rows[item["id"]] = {k: run[k] for k in ("tok_per_s", "new_tokens", "token_ids")}
        progress(f"{item['id']:<14} {item['category']:<9} plain at {session.precision}: {run['tok_per_s']:5.2f} tok/s")
    return {"precision": session.precision, "target": session.target.name, "prompts": rows}


# Tokens each untimed warm-up generation makes: enough for a prefill, a few one-token steps
# and a few verification passes of the adaptive draft length.
WARM_UP_TOKENS = 8


def warm_up_bench(session: Session, ids: list[int], drafter: DrafterKind = "model") -> dict:
    """One untimed plain and one untimed speculative generation of a few tokens of the first
    timed prompt (``ids``), before anything is timed: the first calls of each kernel at that
    prompt's length, first allocations and page-ins of memory-mapped weights otherwise land in
    the first prompt's first timed run (a bench showed 8 tok/s there where the other runs made
    25), and a geometric-mean speedup inherits the error. It starts with compare.warm_up (the
    short prompt an app load warms up with). The costs it measured are forgotten: they are
    one-time costs, and would seed the first timed request's draft length. Returns what ran,
    for the report's settings."""
    start = time.perf_counter()
    warm_up(session, drafter)
    warm = DecodeSettings(max_new_tokens=WARM_UP_TOKENS)
    plain = drain(session.plain(ids, warm))
    spec = drain(session.speculative(ids, warm, drafter))
    session.forget_costs()
    return {"ran": True, "plain_tokens": plain.stats.new_tokens, "speculative_tokens": spec.stats.new_tokens,
            "seconds": time.perf_counter() - start}


def _decode_ratio(plain: dict, spec: dict) -> float | None:
    """Speculative over plain decode rate; None where either run has none (it stopped at its
    first token: a sampled speculative run's text, and so its length, differs from plain's)."""
    return spec["decode_tok_per_s"] / plain["decode_tok_per_s"] if plain["decode_tok_per_s"] and spec["decode_tok_per_s"] else None


def _pool_seeds(seed_rows: list[dict]) -> tuple[dict, dict]:
    """A prompt's plain and speculative lanes over its seeds (``_pooled``), their decode rates
    over the seeds where both lanes have one: the lanes' ratio is then the geometric mean of the
    per-seed ratios. (Each lane's own geometric mean dropped a zero rate alone, and a speculative
    run that stopped at its first token moved the row's ratio off its seeds'.)"""
    rated = [r for r in seed_rows if r["decode_speedup_vs_plain"]]
    return tuple(_pooled([r[lane] for r in seed_rows], [r[lane] for r in rated]) for lane in ("plain", "speculative"))


def _pooled(runs: list[dict], rated: list[dict]) -> dict:
    """One lane's runs of a prompt at several seeds, as one run: rates as geometric means (the
    decode rate over ``rated``, see _pool_seeds), counts summed, acceptance pooled over every
    drafted token."""
    stats_keys = ("new_tokens", "seconds", "target_passes", "drafted", "accepted", "draft_seconds", "verify_seconds")
    stats = {k: sum(r["stats"][k] for r in runs) for k in stats_keys}
    drafted_at: list[int] = []
    accepted_at: list[int] = []
    for r in runs:
        add_counts((drafted_at, accepted_at), r["drafted_at"], r["accepted_at"])
    out = {"pooled_runs": len(runs), "new_tokens": stats["new_tokens"], "seconds": stats["seconds"],
           "tok_per_s": geomean([r["tok_per_s"] for r in runs]),
           "decode_tok_per_s": geomean([r["decode_tok_per_s"] for r in rated]),
           "ttft_s": statistics.fmean(r["ttft_s"] for r in runs if r["ttft_s"] is not None) if any(r["ttft_s"] is not None for r in runs) else None,
           "drafted_at": drafted_at, "accepted_at": accepted_at, "stats": stats}
    if "acceptance" in runs[0]:
        passes = stats["target_passes"]
        out.update(drafted=stats["drafted"], accepted=stats["accepted"],
                   acceptance=stats["accepted"] / stats["drafted"] if stats["drafted"] else 0.0,
                   mean_accepted_per_pass=stats["accepted"] / passes if passes else 0.0,
                   tokens_per_pass=(stats["accepted"] + passes) / passes if passes else 0.0,
                   acceptance_by_position=by_position(drafted_at, accepted_at))
        if "lookup_steps" in runs[0]:
            out.update(lookup_steps=sum(r["lookup_steps"] for r in runs), model_steps=sum(r["model_steps"] for r in runs))
    return out


def _step_cost_ratio(plain: dict, spec: dict) -> dict:
    """Per prompt, from the runs themselves: ms per draft step over ms per plain target step."""
    p, s = plain["stats"], spec["stats"]
    target_ms = 1000 * p["verify_seconds"] / p["target_passes"] if p["target_passes"] else 0.0
    draft_ms = 1000 * s["draft_seconds"] / s["drafted"] if s["drafted"] else 0.0
    return {"target_step_ms": target_ms, "draft_step_ms": draft_ms, "c": draft_ms / target_ms if target_ms and draft_ms else None}


def run_bench(session: Session, prompts: list[dict], max_new_tokens: int, drafter: DrafterKind = "model", progress=print,
              hf: bool = True, agreement: bool = True, baseline: dict | None = None, repeats: int = 1,
              on_report: Callable[[dict], None] | None = None, mode: str = "greedy", temperature: float = 1.0,
              seeds: Sequence[int] = (0, 1, 2), more_settings: Callable[[], dict] | None = None) -> dict:
    """``hf``: also run transformers' plain and assisted generate as references. ``agreement``:
    also measure the drafter's teacher-forced agreement with the target's output, full vocabulary
    vs the reduced head (see engine.bench.draft_agreement). ``baseline``: ``baseline_plain``'s result
    for the same prompts, compared with this run's plain decoding. ``repeats``: run plain
    and speculative decoding of each prompt this many times, alternating, and report each one's
    median run (on a shared machine one run's speed can be off by 30%). ``on_report``: called
    with the report so far after every prompt (``"complete": False``) and with the final one, so
    a caller can save it as it grows: a later failure then keeps the earlier prompts' results.
    ``mode`` "sample": each prompt at ``temperature`` for every seed of ``seeds`` (see the module's
    doc; ``hf`` is ignored there). ``more_settings``: called for each report, its dict merged into
    the report's settings (e.g. the background load that ran)."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    sampled = mode == "sample"
    seeds = list(seeds) if sampled else []
    if sampled and (not seeds or len(set(seeds)) != len(seeds)):
        raise InvalidRequest(f"sampling needs one or more distinct seeds, not {seeds}")
    settings = (DecodeSettings(mode="sample", temperature=temperature, max_new_tokens=max_new_tokens) if sampled
                else DecodeSettings(max_new_tokens=max_new_tokens))
    hf = hf and not sampled
    warmed = warm_up_bench(session, session.encode(prompts[0]["prompt"]), drafter)
    progress(f"warmed up (untimed): {warmed['plain_tokens']} plain and {warmed['speculative_tokens']} speculative "
             f"tokens of {prompts[0]['id']} in {warmed['seconds']:.1f} s")
    # The head agreement and the step probe are a draft model's (an EAGLE-3 or DFlash drafter
    # reads the target's states, which that probe does not keep: scripts/draft_step_cost.py).
    model_drafter = session.model_drafter if drafter == "model" else None
    if not isinstance(model_drafter, DraftModelDrafter):
        model_drafter = None
    head = model_drafter.head if model_drafter is not None else None
    full_head = full_head_like(head) if agreement and head is not None else None
    step_costs = None
    if model_drafter is not None:
        ids = session.encode(prompts[0]["prompt"])
        costs = measure_step_costs(session.target_runner(model_drafter), model_drafter, ids)
        step_costs = {"target_step_ms": costs.target_ms, "draft_step_ms": costs.draft_ms, "c": costs.c}
        progress(f"step costs at {len(ids)} tokens of context: target {costs.target_ms:.1f} ms, "
                 f"draft {costs.draft_ms:.1f} ms, c = {costs.c:.3f}")
    results = []

    def report(complete: bool) -> dict:
        found = _report(session, results, step_costs, head, baseline, max_new_tokens, drafter, repeats)
        found["settings"].update(warm_up=warmed, mode=settings.mode, hf=hf,
                                 temperature=settings.temperature if sampled else None, seeds=seeds or None)
        if more_settings is not None:
            found["settings"].update(more_settings())
        return {"complete": complete, "prompts_planned": len(prompts), **found}

    for item in prompts:
        ids = session.encode(item["prompt"])
        row = {"id": item["id"], "category": item["category"], "prompt_tokens": len(ids)}
        if sampled:
            row["seeds"] = []
            for seed in seeds:
                plain, spec, _ = _timed_pair(session, ids, replace(settings, seed=seed), drafter, repeats)
                seed_row = {"seed": seed, "plain": plain, "speculative": spec,
                            "speedup_vs_plain": spec["tok_per_s"] / plain["tok_per_s"],
                            "decode_speedup_vs_plain": _decode_ratio(plain, spec)}
                row["seeds"].append(seed_row)
                progress(f"{item['id']:<14} seed {seed:<6} plain {plain['tok_per_s']:5.2f} tok/s  spec {spec['tok_per_s']:5.2f} "
                         f"(decode {plain['decode_tok_per_s']:.2f} -> {spec['decode_tok_per_s']:.2f}, "
                         + (f"{seed_row['decode_speedup_vs_plain']:.2f}x" if seed_row["decode_speedup_vs_plain"] else "-")
                         + f", acc {spec['acceptance']:.2f}, {spec['tokens_per_pass']:.2f} tok/pass, "
                         f"{plain['new_tokens']}/{spec['new_tokens']} tokens)")
            row["plain"], row["speculative"] = _pool_seeds(row["seeds"])
            spec = row["speculative"]
            # Plain decoding at one seed repeats its output. Speculative decoding at one seed need
            # not: the adaptive draft length follows measured step times, and a different draft
            # length draws the one generator's numbers in another order (every output is still a
            # valid sample; a fixed draft length repeats). The seeds give different outputs (with
            # one seed, or a tiny model, they may still agree).
            row["plain_repeats_identical"] = all(r["plain"]["repeats_identical"] for r in row["seeds"])
            row["speculative_repeats_identical"] = all(r["speculative"]["repeats_identical"] for r in row["seeds"])
            row["all_runs_identical"] = row["plain_repeats_identical"] and row["speculative_repeats_identical"]
            row["seeds_differ"] = len({tuple(r["plain"]["token_ids"]) for r in row["seeds"]}) > 1
            row["decode_speedup_spread"] = spread([r["decode_speedup_vs_plain"] for r in row["seeds"]])
        else:
            row["plain"], spec, row["all_runs_identical"] = _timed_pair(session, ids, settings, drafter, repeats)
            row["speculative"] = spec
        if hf:
            row["hf_plain"] = _hf(session, ids, max_new_tokens, assisted=False)
            if session.drafter_model is not None:
                row["hf_assisted"] = _hf(session, ids, max_new_tokens, assisted=True)
        if sampled:  # two valid draws from one distribution: not compared token for token
            row["identical"] = row["first_divergence"] = None
        else:
            row["identical"] = row["plain"]["token_ids"] == spec["token_ids"] and row["all_runs_identical"]
            row["first_divergence"] = first_difference(row["plain"]["token_ids"], spec["token_ids"])
        row["speedup_vs_plain"] = spec["tok_per_s"] / row["plain"]["tok_per_s"]
        # Without the prefill both runs share (llama.cpp's tg rates compare this way).
        row["decode_speedup_vs_plain"] = _decode_ratio(row["plain"], spec)
        if baseline is not None and item["id"] in baseline["prompts"]:
            row["baseline_plain"] = baseline["prompts"][item["id"]]
        if model_drafter is not None:
            row["step_costs"] = _step_cost_ratio(row["plain"], spec)
        if full_head is not None:
            text = row["seeds"][0]["plain"] if sampled else row["plain"]  # along the (first seed's) plain output
            found = draft_agreement(session.drafter_model.model, head, full_head, ids, text["token_ids"])
            row["agreement"] = None if found is None else {"full": found.full, "reduced": found.reduced}
        results.append(row)
        if on_report is not None:
            on_report(report(complete=False))
        c = row.get("step_costs", {}).get("c")
        agree = row.get("agreement")
        progress(
            f"{item['id']:<14} {item['category']:<9} plain {row['plain']['tok_per_s']:5.2f} tok/s  "
            f"spec {spec['tok_per_s']:5.2f} ({row['speedup_vs_plain']:.2f}x"
            + (f"; decode {row['plain']['decode_tok_per_s']:.2f} -> {spec['decode_tok_per_s']:.2f}, {row['decode_speedup_vs_plain']:.2f}x"
               if row["decode_speedup_vs_plain"] else "")
            + f", acc {spec['acceptance']:.2f}, "
            f"{spec['tokens_per_pass']:.2f} tok/pass"
            + (f", lookup {spec['lookup_steps']}/{spec['lookup_steps'] + spec['model_steps']} passes" if "lookup_steps" in spec else "") + (f", c {c:.3f}" if c else "") + ")  "
            + (f"agree full {agree['full']:.2f} reduced {agree['reduced']:.2f}  " if agree else "")
            + (f"hf {row['hf_plain']['tok_per_s']:5.2f}  hf-assisted {row.get('hf_assisted', {}).get('tok_per_s', 0):5.2f}  " if hf else "")
            + (f"plain at {baseline['precision']} {row['baseline_plain']['tok_per_s']:5.2f}  " if "baseline_plain" in row else "")
            + (f"over {len(seeds)} seeds at T={settings.temperature:g}"
               + ("" if row["plain_repeats_identical"] else ", PLAIN REPEATS DIFFER")
               if sampled else f"{'identical' if row['identical'] else 'DIFFERS at ' + str(row['first_divergence'])}")
            + (f"  disk page faults plain {row['plain']['major_faults']}, spec {spec['major_faults']}"
               if row["plain"].get("major_faults") or spec.get("major_faults") else "")
        )
    final = report(complete=True)
    if on_report is not None:
        on_report(final)
    return final


def major_faults() -> int | None:
    """Page faults this process has taken that read from disk so far (None where not counted):
    a memory-mapped GGUF target whose pages another program's memory use pushed out takes
    them at every step."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def _faults(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def _timed_pair(session: Session, ids: list[int], settings: DecodeSettings, drafter: DrafterKind,
                repeats: int) -> tuple[dict, dict, bool]:
    """Plain and speculative decoding of ``ids``, ``repeats`` times each, alternating (so a machine
    whose speed drifts slows both alike): each lane's median run (``repeats_identical``: whether
    that lane's repeats made one output) and whether every run of both made the same output."""
    plains, specs = [], []
    for _ in range(repeats):
        # Every run a first turn: none finds an earlier run's prefix in a kept cache.
        session.forget_prefixes()
        before = major_faults()
        plains.append(_ours(session.plain(ids, settings)))
        between = major_faults()
        plains[-1].update(threads_used=list(session.threads.used),  # engine.core.threads: in order
                          major_faults=_faults(before, between))
        session.forget_prefixes()
        specs.append(_speculative(session, ids, settings, drafter))
        specs[-1].update(threads_used=list(session.threads.used), major_faults=_faults(between, major_faults()))
    plain, spec = _median_run(plains), _median_run(specs)
    plain["repeats_identical"] = all(r["token_ids"] == plains[0]["token_ids"] for r in plains)
    spec["repeats_identical"] = all(r["token_ids"] == specs[0]["token_ids"] for r in specs)
    return plain, spec, all(r["token_ids"] == plains[0]["token_ids"] for r in plains + specs)


def _report(session: Session, results: list[dict], step_costs: dict | None, head, baseline: dict | None,
            max_new_tokens: int, drafter: DrafterKind, repeats: int) -> dict:
    options = session.drafter_options
    return {"settings": {"max_new_tokens": max_new_tokens, "precision": session.precision, "drafter": drafter, "repeats": repeats,
                         "threads": session.threads.max_threads, "thread_policy": session.threads.policy,
                         "target": session.target.name,
                         "drafter_model": session.drafter_name,
                         "drafter_weights": session.drafter_model.weights if session.drafter_model else None,
                         "drafter_head": options.head, "draft_vocab_size": options.vocab_size,
                         "min_confidence": options.min_confidence, "lookup": options.lookup,
                         "reduced_head_size": head.base_ids.numel() if head is not None else None,
                         "target_load_seconds": session.target.seconds,
                         "drafter_load_seconds": session.drafter_model.seconds if session.drafter_model else None,
                         "baseline_precision": baseline["precision"] if baseline else None},
            "step_costs": step_costs, "prompts": list(results), "summary": summarize(results)}
