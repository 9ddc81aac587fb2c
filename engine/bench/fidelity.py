"""How close each of Tandem's precisions stays to the model a GGUF file stands for.

The reference is the fp32 model of the file's weights, dequantized by gguf-py
(engine.gguf.dequantized): the values the file holds, computed without further rounding. Not
the converted folder at "fp32": that folder stores the dequantized values in bf16, which
rounds ~98% of the default target's Q4_K weights (``compare_weights`` measures it).

Teacher-forced, so every model is judged on the same text: for each prompt the reference
greedily writes ``new_tokens`` tokens once; each candidate then scores prompt + those tokens in
one forward pass, and at every written position

    top-1 agreement   argmax of the candidate's next-token distribution == the reference's
    KL(ref || cand)   sum_x p_ref(x) (log p_ref(x) - log p_cand(x)), in nats, averaged

pooled over all positions of all prompts. On a fixed text (resources/texts/fidelity.txt) every
model's perplexity exp(mean -log p(next token)) is measured as well, with the same agreement and
KL there. The reference's log-probabilities are kept (positions x vocabulary, fp32: ~0.4 GB for
the default prompts and text) and the reference freed before any candidate loads, so only one
model is in memory at a time.

Candidates: "file" (the file's own quantization computed natively, engine.gguf, scored as the
engine runs it: GgufRunner, its K/V cache in fp16, the prompt fed in PREFILL_CHUNK chunks),
"file-kv32" (the same with an fp32 cache: what the 16-bit cache alone changes), and from the
converted folder "bf16" (bf16), "fp32" (fp32 of the bf16 conversion), "int8" and "int4"
(Tandem's re-quantizations of it).
"""
from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.core.heap import release_freed_memory
from engine.models.runners.runner import ModelRunner

log = logging.getLogger(__name__)

CANDIDATES = ("file", "file-kv32", "int8", "int4", "bf16", "fp32")
DESCRIPTIONS = {
    "file": "the file's own quantization, computed natively from its blocks, K/V cached in fp16",
    "file-kv32": "the same, K/V cached in fp32 (what the 16-bit cache changes)",
    "int8": "Tandem's int8 re-quantization of the bf16 conversion",
    "int4": "Tandem's int4 re-quantization of the bf16 conversion",
    "bf16": "the bf16 conversion (dequantized values rounded to bf16), computed in bf16",
    "fp32": "the bf16 conversion computed in fp32 (what bf16 storage alone changes)",
}


# -- the measures ------------------------------------------------------------------------------


def top1_agreement(ref: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """[T] bool: at each position, is the candidate's most likely token the reference's?
    ``ref``, ``cand``: [T, V] log-probabilities (or logits)."""
    return ref.argmax(-1) == cand.argmax(-1)


def kl_divergence(ref: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """[T] float64: KL(ref || cand) in nats at each position, from [T, V] log-probabilities."""
    ref, cand = ref.double(), cand.double()
    return (ref.exp() * (ref - cand)).sum(-1).clamp_min(0.0)  # >= 0; the clamp only drops rounding


def negative_log_likelihood(log_probs: torch.Tensor, next_ids: list[int] | torch.Tensor) -> torch.Tensor:
    """[T] float64: -log p(next_ids[t]) at each position of [T, V] log-probabilities."""
    index = torch.as_tensor(next_ids, dtype=torch.long).view(-1, 1)
    return -log_probs.double().gather(-1, index)[:, 0]


def perplexity(log_probs: torch.Tensor, next_ids: list[int] | torch.Tensor) -> float:
    return float(negative_log_likelihood(log_probs, next_ids).mean().exp())


def scored_log_probs(model, ids: list[int], n: int, kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """[n, V] fp32 log-probabilities of the token after each of the last ``n`` positions of
    ``ids``, on a fresh cache: one forward pass through transformers (``kv_dtype`` None), or
    as GgufRunner runs a GGUF model with its cache in ``kv_dtype``, in prefill chunks."""
    if kv_dtype is None:
        return torch.log_softmax(ModelRunner(model).forward(list(ids), n_logits=n), dim=-1)
    from engine.core.settings import PREFILL_CHUNK
    from engine.models.runners.gguf_runner import GgufRunner

    runner, ids = GgufRunner(model, kv_dtype=kv_dtype), list(ids)
    first_scored = len(ids) - n
    parts = []
    for start in range(0, len(ids), PREFILL_CHUNK):
        chunk = ids[start : start + PREFILL_CHUNK]
        wanted = min(len(chunk), start + len(chunk) - first_scored)
        logits = runner.forward(chunk, n_logits=max(1, wanted))
        if wanted > 0:
            parts.append(torch.log_softmax(logits, dim=-1))
    return torch.cat(parts)


@dataclass(frozen=True)
class Agreement:
    """Pooled over ``positions``: the share where the argmaxes agree, the mean KL(ref || cand)."""

    positions: int
    top1_agreement: float
    mean_kl: float

    @classmethod
    def pooled(cls, agree: list[torch.Tensor], kl: list[torch.Tensor]) -> Agreement:
        a, k = torch.cat(agree), torch.cat(kl)
        return cls(int(a.numel()), float(a.double().mean()), float(k.mean()))


# -- the reference -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceSequence:
    """A prompt and the reference's greedy continuation of it; ``log_probs`` [len(generated), V]:
    the reference's distributions at the written positions, from one pass as candidates score."""

    id: str
    category: str
    prompt_ids: tuple[int, ...]
    generated: tuple[int, ...]
    log_probs: torch.Tensor

    @property
    def scored_ids(self) -> list[int]:
        return list(self.prompt_ids) + list(self.generated[:-1])


@dataclass(frozen=True)
class Reference:
    sequences: tuple[ReferenceSequence, ...]
    text_ids: tuple[int, ...]
    text_log_probs: torch.Tensor  # [len(text_ids) - 1, V]
    seconds: float

    @property
    def text_perplexity(self) -> float:
        return perplexity(self.text_log_probs, self.text_ids[1:])


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """As the app sends a prompt: one user message through the chat template, if there is one."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def stop_ids(model, tokenizer) -> set[int]:
    found: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        found.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
    return found


@torch.inference_mode()
def greedy_continuation(model, prompt_ids: list[int], n: int, stop: set[int]) -> list[int]:
    """Up to ``n`` tokens, greedy, ending early after a stop token (which is kept)."""
    runner = ModelRunner(model)
    logits = runner.forward(list(prompt_ids))
    out: list[int] = []
    while len(out) < n:
        token = int(logits[-1].argmax())
        out.append(token)
        if token in stop or len(out) == n:
            break
        logits = runner.forward([token])
    return out


def build_reference(model, tokenizer, prompts: list[dict], new_tokens: int, text: str, max_text_tokens: int = 0,
                    progress: Callable[[str], None] = log.info) -> Reference:
    start = time.perf_counter()
    stop = stop_ids(model, tokenizer)
    sequences = []
    for p in prompts:
        prompt_ids = encode_prompt(tokenizer, p["prompt"])
        generated = greedy_continuation(model, prompt_ids, new_tokens, stop)
        ids = prompt_ids + generated[:-1]
        sequences.append(ReferenceSequence(p["id"], p["category"], tuple(prompt_ids), tuple(generated),
                                           scored_log_probs(model, ids, len(generated))))
        progress(f"  reference {p['id']}: {len(generated)} tokens")
    text_ids = list(tokenizer(text)["input_ids"])
    if max_text_tokens:
        text_ids = text_ids[:max_text_tokens]
    if len(text_ids) < 2:
        raise ValueError("the perplexity text must be at least two tokens long")
    text_log_probs = scored_log_probs(model, text_ids[:-1], len(text_ids) - 1)
    return Reference(tuple(sequences), tuple(text_ids), text_log_probs, time.perf_counter() - start)


# -- candidates --------------------------------------------------------------------------------


@torch.inference_mode()
def score_candidate(model, reference: Reference, kv_dtype: torch.dtype | None = None) -> dict:
    """The candidate against the reference: pooled, per category, per prompt, and on the text.
    ``kv_dtype``: scored on GgufRunner with that cache (scored_log_probs)."""
    rows, agree, kl, by_category = [], [], [], {}
    for seq in reference.sequences:
        cand = scored_log_probs(model, seq.scored_ids, len(seq.generated), kv_dtype)
        a, k = top1_agreement(seq.log_probs, cand), kl_divergence(seq.log_probs, cand)
        agree.append(a)
        kl.append(k)
        by_category.setdefault(seq.category, ([], []))
        by_category[seq.category][0].append(a)
        by_category[seq.category][1].append(k)
        rows.append({"id": seq.id, "category": seq.category, **asdict(Agreement.pooled([a], [k]))})
    text = scored_log_probs(model, list(reference.text_ids[:-1]), len(reference.text_ids) - 1, kv_dtype)
    on_text = Agreement.pooled([top1_agreement(reference.text_log_probs, text)], [kl_divergence(reference.text_log_probs, text)])
    return {
        "prompts": asdict(Agreement.pooled(agree, kl)),
        "by_category": {c: asdict(Agreement.pooled(*v)) for c, v in by_category.items()},
        "per_prompt": rows,
        "text": {"perplexity": perplexity(text, reference.text_ids[1:]), **asdict(on_text)},
    }


@torch.inference_mode()
def compare_weights(reference_model, folder: Path) -> dict:
    """How the converted folder's stored weights relate to the reference's (the file's values):
    whether they are exactly those values rounded to the folder's dtype, and what share of the
    weights that rounding leaves unchanged."""
    from safetensors import safe_open

    ref = reference_model.state_dict()
    total = unchanged = 0
    rounding_only, worst, dtypes = True, 0.0, set()
    compared = []
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                if name not in ref:
                    continue
                stored, want = f.get_tensor(name), ref[name].reshape(-1)
                stored = stored.reshape(-1)
                dtypes.add(str(stored.dtype).removeprefix("torch."))
                rounding_only &= torch.equal(want.to(stored.dtype), stored)
                wide = stored.float()
                unchanged += int((wide == want).sum())
                total += want.numel()
                scale = float(want.abs().max())
                if scale:
                    worst = max(worst, float((wide - want).abs().max()) / scale)
                compared.append(name)
                del stored, wide
    release_freed_memory()
    return {"folder": str(folder), "dtypes": sorted(dtypes), "tensors": len(compared), "weights": total,
            "equals_rounded_reference": rounding_only, "share_unchanged": unchanged / total if total else None,
            "max_error_relative_to_tensor_max": worst, "lossless": rounding_only and unchanged == total}


def free(*_models) -> None:
    """Let the last references go (the caller deletes its own) and hand the heap back."""
    gc.collect()
    release_freed_memory()


def run_fidelity(gguf_path: Path, folder: Path | None, candidates: list[str], prompts: list[dict], text: str,
                 new_tokens: int, max_text_tokens: int = 0, check_weights: bool = True,
                 on_report: Callable[[dict], None] | None = None, progress: Callable[[str], None] = log.info) -> dict:
    """Reference first, alone in memory; then each candidate alone (loaded, scored, freed).
    ``on_report`` gets the report so far after every stage (so a later failure keeps it)."""
    from engine.gguf.dequantized import load_dequantized
    from engine.models.loading.loader import load_model

    report: dict = {"gguf": str(gguf_path), "folder": str(folder) if folder else None, "new_tokens": new_tokens,
                    "prompts": [p["id"] for p in prompts], "threads": torch.get_num_threads(), "candidates": {}}
    progress(f"reference: fp32 model of {Path(gguf_path).name}'s dequantized weights")
    start = time.perf_counter()
    model, tokenizer = load_dequantized(gguf_path)
    load_s = time.perf_counter() - start
    if check_weights and folder is not None:
        report["converted_weights"] = compare_weights(model, folder)
    reference = build_reference(model, tokenizer, prompts, new_tokens, text, max_text_tokens, progress)
    del model
    free()
    report["reference"] = {"model": "fp32, every tensor dequantized by gguf-py", "load_s": load_s,
                           "score_s": reference.seconds, "text_tokens": len(reference.text_ids),
                           "positions": sum(len(s.generated) for s in reference.sequences),
                           "text_perplexity": reference.text_perplexity,
                           "generated": {s.id: list(s.generated) for s in reference.sequences}}
    if on_report:
        on_report(report)
    for name in candidates:
        progress(f"{name}: {DESCRIPTIONS[name]}")
        start = time.perf_counter()
        from_file = name in ("file", "file-kv32")
        loaded = load_model(gguf_path, "file", "cpu") if from_file else load_model(folder, name, "cpu")
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        kv_dtype = None
        if from_file:
            from engine.models.runners import gguf_runner

            if gguf_runner.worth_using(loaded.model):  # as the engine runs it; else transformers'
                kv_dtype = torch.float32 if name == "file-kv32" else gguf_runner.KV_DTYPE
        scored = score_candidate(loaded.model, reference, kv_dtype)
        report["candidates"][name] = {"description": DESCRIPTIONS[name], "weights": loaded.weights,
                                      "kv_cache": str(kv_dtype).removeprefix("torch.") if kv_dtype else "transformers (fp32)",
                                      "quantization": loaded.quantization, "load_s": load_s,
                                      "score_s": time.perf_counter() - start, **scored}
        del loaded
        free()
        if on_report:
            on_report(report)
    return report


def format_table(report: dict) -> str:
    """The figures as a plain-text table, one line per candidate."""
    ref = report["reference"]
    lines = [(f"reference: fp32 of the file's dequantized weights; {ref['positions']} generated positions,"
              f" text perplexity {ref['text_perplexity']:.3f} ({ref['text_tokens']} tokens)"),
             f"{'candidate':<14} {'top-1 agree':>11} {'mean KL':>10} {'text ppl':>9} {'text agree':>10} {'text KL':>9}"]
    for name, c in report["candidates"].items():
        label = name if not c["quantization"] else f"{name} ({c['quantization']})"
        lines.append(f"{label:<14} {c['prompts']['top1_agreement']:>11.2%} {c['prompts']['mean_kl']:>10.5f}"
                     f" {c['text']['perplexity']:>9.3f} {c['text']['top1_agreement']:>10.2%} {c['text']['mean_kl']:>9.5f}")
    weights = report.get("converted_weights")
    if weights:
        lines.append(f"converted folder ({', '.join(weights['dtypes'])}): "
                     + ("identical to the file's values" if weights["lossless"] else
                        f"the file's values rounded, {weights['share_unchanged']:.1%} of them unchanged"
                        if weights["equals_rounded_reference"] else "NOT the file's values rounded")
                     + f"; largest change {weights['max_error_relative_to_tensor_max']:.2e} of a tensor's largest weight")
    return "\n".join(lines)
