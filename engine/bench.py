"""Benchmark: our plain and speculative decoding next to transformers' own generate, same run.

For every prompt, in this order: our plain, our speculative, transformers' plain generate and
transformers' generate with ``assistant_model``. All greedy on the same prompt ids, so their
outputs can be compared token for token.
"""
from __future__ import annotations

import json
import logging
import math
import resource
import time
from dataclasses import asdict
from pathlib import Path

import torch

from engine.compare import drain, warm_up
from engine.divergence import first_difference
from engine.session import DrafterKind, Session
from engine.settings import DecodeSettings

log = logging.getLogger(__name__)


def read_prompts(path: Path) -> list[dict]:
    prompts = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        missing = {"id", "category", "prompt"} - item.keys()
        if missing:
            raise ValueError(f"{path}:{n}: missing {sorted(missing)}")
        prompts.append(item)
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def _ours(events) -> dict:
    result = drain(events)
    s = result.stats
    return {
        "new_tokens": s.new_tokens,
        "seconds": s.seconds,
        "tok_per_s": s.tok_per_s,
        "ttft_s": s.ttft_s,
        "token_ids": list(result.token_ids),
        "stats": asdict(s),
    }


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


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else 0.0


def run_bench(session: Session, prompts: list[dict], max_new_tokens: int, drafter: DrafterKind = "model", progress=print) -> dict:
    settings = DecodeSettings(max_new_tokens=max_new_tokens)
    warm_up(session, drafter)
    results = []
    for item in prompts:
        ids = session.encode(item["prompt"])
        row = {"id": item["id"], "category": item["category"], "prompt_tokens": len(ids)}
        row["plain"] = _ours(session.plain(ids, settings))
        spec = _ours(session.speculative(ids, settings, drafter))
        s = spec["stats"]
        spec.update(drafted=s["drafted"], accepted=s["accepted"], acceptance=s["acceptance"], mean_accepted_per_pass=s["mean_accepted_per_pass"], tokens_per_pass=s["tokens_per_pass"])
        row["speculative"] = spec
        row["hf_plain"] = _hf(session, ids, max_new_tokens, assisted=False)
        if session.drafter_model is not None:
            row["hf_assisted"] = _hf(session, ids, max_new_tokens, assisted=True)
        row["identical"] = row["plain"]["token_ids"] == spec["token_ids"]
        row["first_divergence"] = first_difference(row["plain"]["token_ids"], spec["token_ids"])
        row["speedup_vs_plain"] = spec["tok_per_s"] / row["plain"]["tok_per_s"]
        results.append(row)
        progress(
            f"{item['id']:<14} {item['category']:<9} plain {row['plain']['tok_per_s']:5.2f} tok/s  "
            f"spec {spec['tok_per_s']:5.2f} ({row['speedup_vs_plain']:.2f}x, acc {spec['acceptance']:.2f}, "
            f"{spec['tokens_per_pass']:.2f} tok/pass)  hf {row['hf_plain']['tok_per_s']:5.2f}  "
            f"hf-assisted {row.get('hf_assisted', {}).get('tok_per_s', 0):5.2f}  "
            f"{'identical' if row['identical'] else 'DIFFERS at ' + str(row['first_divergence'])}"
        )
    return {"settings": {"max_new_tokens": max_new_tokens, "precision": session.precision, "drafter": drafter,
                         "threads": torch.get_num_threads(), "target": session.target.name,
                         "drafter_model": session.drafter_model.name if session.drafter_model else None,
                         "target_load_seconds": session.target.seconds},
            "prompts": results, "summary": summarize(results)}


def summarize(results: list[dict]) -> dict:
    def ratio(a: str, b: str, rows=results) -> float:
        return geomean([r[a]["tok_per_s"] / r[b]["tok_per_s"] for r in rows if a in r and b in r])

    by_category = {}
    for cat in sorted({r["category"] for r in results}):
        rows = [r for r in results if r["category"] == cat]
        by_category[cat] = {"speedup_vs_plain": ratio("speculative", "plain", rows),
                            "acceptance": sum(r["speculative"]["acceptance"] for r in rows) / len(rows)}
    return {
        "speedup_vs_plain": ratio("speculative", "plain"),
        "speedup_vs_hf_assisted": ratio("speculative", "hf_assisted"),
        "plain_vs_hf_plain": ratio("plain", "hf_plain"),
        "hf_assisted_vs_hf_plain": ratio("hf_assisted", "hf_plain"),
        "identical_fraction": sum(r["identical"] for r in results) / len(results),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "by_category": by_category,
    }
