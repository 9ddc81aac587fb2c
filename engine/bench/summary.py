"""A bench run's figures: the geometric means over prompts (and seeds), their spread, and the
summary the JSON report and the CLI print."""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from engine.bench.memory_probe import peak_rss_bytes


def by_position(drafted: Sequence[int], accepted: Sequence[int]) -> list[float]:
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted)]


def add_counts(into: tuple[list[int], list[int]], drafted: Sequence[int], accepted: Sequence[int]) -> None:
    for total, counts in zip(into, (drafted, accepted)):
        total.extend([0] * (len(counts) - len(total)))
        for i, n in enumerate(counts):
            total[i] += n


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else 0.0


# Two-sided 95% quantiles of Student's t, by degrees of freedom (1-30); 1.96 beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def spread(values: list[float]) -> dict | None:
    """A geometric mean's spread: min, max, and a 95% interval of the geometric mean (the mean of
    the logs +- t * their standard error, treating the values as independent draws)."""
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    logs = [math.log(v) for v in values]
    out = {"n": len(values), "geomean": geomean(values), "min": min(values), "max": max(values), "ci95": None}
    if len(logs) > 1:
        half = (_T95[len(logs) - 2] if len(logs) - 1 <= len(_T95) else 1.96) * statistics.stdev(logs) / math.sqrt(len(logs))
        mean = statistics.fmean(logs)
        out["ci95"] = [math.exp(mean - half), math.exp(mean + half)]
    return out


def summarize(results: list[dict]) -> dict:
    def ratio(a: str, b: str, rows=results, metric: str = "tok_per_s") -> float:
        return geomean([r[a][metric] / r[b][metric] for r in rows if a in r and b in r and r[b].get(metric)])

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    def agreement(rows, key):
        return mean([r["agreement"][key] for r in rows if r.get("agreement")])

    def tok_per_s(key, rows, metric="tok_per_s"):
        return geomean([r[key][metric] for r in rows if key in r and metric in r[key]])

    def decode(rows) -> dict:
        """The same figures without the prefill: tokens after the first over the time after it."""
        return {"decode_speedup_vs_plain": ratio("speculative", "plain", rows, "decode_tok_per_s"),
                "plain_decode_tok_per_s": tok_per_s("plain", rows, "decode_tok_per_s"),
                "speculative_decode_tok_per_s": tok_per_s("speculative", rows, "decode_tok_per_s")}

    by_category = {}
    for cat in sorted({r["category"] for r in results}):
        rows = [r for r in results if r["category"] == cat]
        by_category[cat] = {"speedup_vs_plain": ratio("speculative", "plain", rows),
                            "plain_tok_per_s": tok_per_s("plain", rows),
                            "speculative_tok_per_s": tok_per_s("speculative", rows),
                            **decode(rows),
                            "plain_vs_baseline_plain": ratio("plain", "baseline_plain", rows) or None,
                            "acceptance": sum(r["speculative"]["acceptance"] for r in rows) / len(rows),
                            "agreement_full": agreement(rows, "full"),
                            "agreement_reduced": agreement(rows, "reduced")}
    code_rewrite = [r for r in results if r["category"] in ("code", "rewrite")]
    compared = [r for r in results if r.get("identical") is not None]
    # Every timed pair: one per prompt (greedy), one per (prompt, seed) (sampled).
    pairs = [(r["id"], s["seed"], s) for r in results for s in r["seeds"]] if any("seeds" in r for r in results) else \
        [(r["id"], None, r) for r in results]
    drafted_at: list[int] = []
    accepted_at: list[int] = []
    for r in results:
        if "drafted_at" in r["speculative"]:
            add_counts((drafted_at, accepted_at), r["speculative"]["drafted_at"], r["speculative"]["accepted_at"])
    seeds = sorted({seed for _, seed, _ in pairs if seed is not None})
    return {
        # The geometric mean over every timed pair (decode_speedup_vs_plain, below) and its spread.
        "decode_speedup_spread": spread([p["decode_speedup_vs_plain"] for _, _, p in pairs]),
        "speedup_spread": spread([p["speedup_vs_plain"] for _, _, p in pairs]),
        "decode_speedup_by_seed": {str(seed): geomean([p["decode_speedup_vs_plain"] or 0 for _, s, p in pairs if s == seed])
                                   for seed in seeds} or None,
        # Over every drafted token of every speculative run: at draft position i, the fraction accepted.
        "acceptance_by_position": by_position(drafted_at, accepted_at),
        "drafted_by_position": drafted_at,
        "speedup_vs_plain": ratio("speculative", "plain"),
        "speedup_vs_plain_code_rewrite": ratio("speculative", "plain", code_rewrite) if code_rewrite else None,
        "speedup_vs_hf_assisted": ratio("speculative", "hf_assisted"),
        "plain_vs_hf_plain": ratio("plain", "hf_plain"),
        # e.g. int8 target's plain decoding over the bf16 target's (geometric mean over prompts)
        "plain_vs_baseline_plain": ratio("plain", "baseline_plain") or None,
        "plain_tok_per_s": tok_per_s("plain", results),
        "speculative_tok_per_s": tok_per_s("speculative", results),
        **decode(results),
        "hf_assisted_vs_hf_plain": ratio("hf_assisted", "hf_plain"),
        # Greedy rows only (sampled ones are not compared token for token): None for a sampled bench.
        "identical_fraction": (sum(r["identical"] for r in compared) / len(compared)) if compared else None,
        "c_mean": mean([r.get("step_costs", {}).get("c") for r in results]),
        "agreement_full": agreement(results, "full"),
        "agreement_reduced": agreement(results, "reduced"),
        "peak_rss_mb": peak_rss_bytes() / 2**20,
        "by_category": by_category,
    }
