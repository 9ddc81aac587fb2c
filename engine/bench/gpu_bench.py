"""Per-pass costs on a GPU with the default pair's real shapes, and the speedup they imply.

The real weights cannot travel to a lent GPU machine, but the cost of a forward pass depends on
the shapes, not the values: this builds Qwen2.5-Coder-1.5B (target) and -0.5B (drafter) with
random weights, measures with the engine's own ModelRunner / DraftModelDrafter and the verify
kernels, and projects the speedup from acceptance rates measured on the CPU with the real
weights (docs/benchmarks/*.json):

    t(m)       target pass over m new tokens at ``--context`` tokens of cache (m = 1 .. k+1)
    d          drafter cost per drafted token (DraftModelDrafter.propose of k tokens / k)
    v          one verification (greedy) with the chosen backend, including its host sync
    E(a, k)    expected tokens per target pass = (1 - a^(k+1)) / (1 - a)   (a = acceptance)
    S(k)       E(a, k) * t(1) / (t(k+1) + k * d + v), best over k = 1..max_k

Acceptance is the CPU benchmark's accepted/drafted per prompt category (adaptive k there), used
as if every position were accepted independently: a projection, not a measurement.

    python -m engine.bench.gpu_bench                # the real shapes, on the best device
    python -m engine.bench.gpu_bench --tiny         # tiny shapes, seconds on a CPU (the test)
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
_COMMON = {"max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
SHAPES = {
    # Qwen2.5-Coder-1.5B-Instruct: head_dim 1536 / 12 = 128
    "target": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
               "intermediate_size": 8960, "vocab_size": 151936, **_COMMON},
    # Qwen2.5-Coder-0.5B-Instruct: head_dim 896 / 14 = 64
    "drafter": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                "intermediate_size": 4864, "vocab_size": 151936, **_COMMON},
}
TINY_SHAPES = {
    "target": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 128, "vocab_size": 512, **_COMMON},
    "drafter": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                "intermediate_size": 64, "vocab_size": 512, **_COMMON},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Which CPU benchmark runs hold acceptance for a dtype (runs before the one precision vocabulary
# recorded bf16 as "fast" and fp32 as "exact").
_BENCH_PRECISION = {"bf16": ("bf16", "fast"), "fp16": ("bf16", "fast"), "fp32": ("fp32", "exact")}


def build_random_model(shape: dict, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A Qwen2 causal LM with ``shape`` and random weights, built directly on ``device``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def median_seconds(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 2) -> float:
    """Median wall time of ``fn`` with the device drained before and after each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def target_pass_seconds(model, context: int, max_rows: int, reps: int) -> dict[int, float]:
    """{m: seconds of one target pass over m new tokens after ``context`` cached ones}."""
    from engine.models.runners.runner import ModelRunner

    runner = ModelRunner(model)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
    runner.forward(prompt)
    new = torch.randint(0, vocab, (max_rows,), generator=gen).tolist()
    out = {}
    for m in range(1, max_rows + 1):
        def one_pass(m=m):
            runner.forward(new[:m], n_logits=m)
            runner.crop(context)

        out[m] = median_seconds(one_pass, runner.device, reps)
    return out


def draft_seconds_per_token(model, context: int, k: int, reps: int) -> float:
    """What DraftModelDrafter.propose costs per drafted token (k greedy draft steps, one sync)."""
    from engine.core.sampler import Sampler
    from engine.core.settings import DecodeSettings
    from engine.drafters import DraftModelDrafter

    drafter = DraftModelDrafter(model)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(1)).tolist()
    drafter.prepare(prompt)
    sampler = Sampler(DecodeSettings(), drafter.runner.device)

    def propose():
        drafter.propose(prompt, k, sampler)
        drafter.observe(context - 1)  # back to "everything but the last token is cached"

    return median_seconds(propose, drafter.runner.device, reps) / k


def verify_seconds(vocab: int, k: int, device: torch.device, reps: int) -> dict[str, dict[str, float]]:
    """{backend: {"greedy": s, "sampled": s}} for one verification of k drafts at ``vocab``."""
    import kernels.verify as verify

    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(k + 1, vocab, generator=gen).to(device)
    p = logits.softmax(-1)
    q = (logits[:k] + torch.randn(k, vocab, generator=gen).to(device)).softmax(-1)
    drafts = logits[:k].argmax(-1).cpu()
    rng = torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(3)
    results = {}
    previous = verify.active_backend()
    try:
        for name in verify.available_backends():
            verify.use_backend(name)
            results[name] = {
                "greedy": median_seconds(lambda: verify.verify_greedy(drafts, logits), device, reps),
                "sampled": median_seconds(lambda: verify.verify_sampled(drafts, q, p, rng), device, reps),
            }
    finally:
        verify.use_backend(previous)
    return results


def acceptance_by_category(precision: tuple[str, ...], folder: Path = REPO / "docs" / "benchmarks") -> dict[str, float]:
    """{category: acceptance} from the newest CPU benchmark run at one of the ``precision``
    names; empty when none is found."""
    for path in sorted(folder.glob("*.json"), reverse=True):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
            continue  # another script's figures (a list of rows), not a `tandem bench` report
        if data["settings"].get("precision") not in precision:
            continue
        categories = data.get("summary", {}).get("by_category", {})
        found = {c: float(v["acceptance"]) for c, v in categories.items() if "acceptance" in v}
        if found:
            return found
    return {}


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per target pass when each of k drafts is accepted with probability alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def project(alpha: float, target: dict[int, float], draft: float, verify: float) -> tuple[int, float]:
    """(best k, speedup over plain decoding) from measured costs; k = 0 means don't draft."""
    best = (0, 1.0)
    for k in range(1, max(target)):
        speed = expected_tokens(alpha, k) * target[1] / (target[k + 1] + k * draft + verify)
        if speed > best[1]:
            best = (k, speed)
    return best


def run(tiny: bool = False, device: str = "auto", dtypes: tuple[str, ...] = ("bf16", "fp32"), context: int = 128,
        max_k: int = 8, reps: int = 20) -> dict:
    """Measure everything; returns a JSON-able dict (``report`` turns it into text)."""
    from engine.models.loading.placement import pick_device

    dev = pick_device(device)
    shapes = TINY_SHAPES if tiny else SHAPES
    if tiny:
        context, max_k, reps = min(context, 16), min(max_k, 3), min(reps, 3)
    import kernels.verify as verify

    result = {"device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
              "tiny": tiny, "context": context, "verify_backend": verify.active_backend(), "torch": torch.__version__,
              "shapes": shapes, "by_dtype": {}}
    for name in dtypes:
        dtype = DTYPES[name]
        log.info("building random %s models on %s", name, dev)
        target = build_random_model(shapes["target"], dtype, dev, seed=0)
        t = target_pass_seconds(target, context, max_k + 1, reps)
        del target
        drafter = build_random_model(shapes["drafter"], dtype, dev, seed=1)
        d = draft_seconds_per_token(drafter, context, min(4, max_k), reps)
        del drafter
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        alphas = acceptance_by_category(_BENCH_PRECISION[name])
        result["by_dtype"][name] = {
            "target_seconds": {str(m): s for m, s in t.items()},
            "draft_seconds_per_token": d,
            "acceptance_source": "docs/benchmarks (CPU, real weights)" if alphas else "none found: assumed",
            "acceptance": alphas or {"assumed-0.5": 0.5, "assumed-0.7": 0.7, "assumed-0.9": 0.9},
        }
    result["verify_seconds"] = verify_seconds(shapes["target"]["vocab_size"], min(4, max_k), dev, reps * 2)
    v = result["verify_seconds"][result["verify_backend"]]["greedy"]
    for name, row in result["by_dtype"].items():
        t = {int(m): s for m, s in row["target_seconds"].items()}
        row["projection"] = {c: dict(zip(("k", "speedup"), project(a, t, row["draft_seconds_per_token"], v)))
                             for c, a in row["acceptance"].items()}
    return result


def report(result: dict) -> str:
    ms = lambda s: f"{s * 1000:8.2f} ms"  # noqa: E731
    lines = [f"device: {result['device']} ({result['device_name']}), torch {result['torch']}, "
             f"{'TINY shapes' if result['tiny'] else 'Qwen2.5-Coder-1.5B / 0.5B shapes'}, random weights, "
             f"context {result['context']} tokens"]
    for name, row in result["by_dtype"].items():
        t = row["target_seconds"]
        t1 = t["1"]
        lines.append(f"\n[{name}] target pass, m new tokens (v = t(m)/t(1)):")
        for m, s in t.items():
            lines.append(f"  m={m:>2} {ms(s)}  v={s / t1:5.2f}")
        d = row["draft_seconds_per_token"]
        lines.append(f"  drafter, per drafted token: {ms(d)}  c = drafter/target = {d / t1:.2f}")
        lines.append(f"  projected speedup (acceptance: {row['acceptance_source']}):")
        for c, a in row["acceptance"].items():
            p = row["projection"][c]
            lines.append(f"    {c:<12} a={a:.2f}  best k={p['k']}  {p['speedup']:.2f}x")
    lines.append(f"\nverify, k=4, vocab {result['shapes']['target']['vocab_size']} (incl. the host sync); active: "
                 f"{result['verify_backend']}")
    for backend, times in result["verify_seconds"].items():
        lines.append(f"  {backend:<10} greedy {ms(times['greedy'])}   sampled {ms(times['sampled'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench.gpu_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a quick check on a CPU)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp16, fp32")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        parser.error(f"unknown dtype(s) {unknown}; choose from {sorted(DTYPES)}")
    result = run(args.tiny, args.device, dtypes, args.context, args.max_k, args.reps)
    emit(result, report(result), args.json)
    return 0


def emit(result: dict, text: str, json_path: Path | None) -> None:
    """A bench's figures: the JSON written where asked, the readable report on stdout."""
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=1))
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
