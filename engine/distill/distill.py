"""``tandem distill``: an EAGLE-3 drafter trained here for a target that has none.

1. Data: the target's own replies to prompts (and, where given, text files read teacher-forced),
   one pass each through the target's runner (engine.distill.teacher); kept in the output's
   ``training/`` folder, so a resumed run does not make them again.
2. Training (engine.distill.training) for a time budget, a held-out tenth of the texts scored
   as training goes; the state is saved every few minutes, and a killed run resumes from it.
3. The best drafter so far (by held-out tokens per pass) is always on disk in the Speculators
   format (engine.distill.save), beside the record of how it was made: stopping at any time
   keeps it.
"""
from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.distill import new_drafter, save, teacher, training
from engine.distill.teacher import Sample
from engine.models.planning.speculators_config import default_aux_layers

STATE = "state.pt"
#: The temperature of sampled replies: the chat's default, where the target's replies vary and stay on topic.
SAMPLED_TEMPERATURE = 0.7
#: Written when the data is complete: the shards it is made of, in order. (Runs before shards
#: wrote the whole data once more as one file, ``LEGACY_DATA``; it is still read.)
DATA_DONE = "data.json"
LEGACY_DATA = "data.pt"


@dataclass(frozen=True)
class DistillSettings:
    minutes: float = 20.0
    #: Replies the target writes to the prompts (tokens each).
    reply_tokens: int = 192
    #: Draft vocabulary: the ids the data uses most.
    draft_vocab: int = 16384
    #: Inner width of the drafter's MLP (None: twice the hidden size, at most the target's).
    inner: int | None = None
    #: Draft steps trained together (and the held-out figure's drafts per pass).
    steps: int = 3
    learning_rate: float = 1e-3
    checkpoint_minutes: float = 3.0
    seed: int = 0
    text_files: tuple[Path, ...] = field(default_factory=tuple)
    text_tokens: int = 20000
    #: Stop after this many training steps too (None: the time budget alone).
    max_steps: int | None = None
    #: Target layers the drafter reads (None: EAGLE-3's default for the target's depth).
    aux_layers: tuple[int, ...] | None = None
    #: Labels: the target's k likeliest next tokens with their probabilities (the drafter learns
    #: the target's distribution, renormalized over them); 0: its argmax alone.
    top_k: int = 32
    #: Windows of each text file taken before any file gives more (spreads the text over files).
    windows_per_file: int = 2
    #: The share of the target's replies held out to score the drafter (texts are all trained on).
    heldout_share: float = 0.1
    #: Replies sampled (temperature SAMPLED_TEMPERATURE, seeded) to each prompt besides its greedy
    #: one: more of the target's ways of answering from the same prompts, made after every greedy one.
    sampled_replies: int = 0
    #: Stop making data after this long (None: make it all) and train on what was made.
    data_minutes: float | None = None
    #: Where the drafter trains: "auto" (a GPU where torch sees one, else the CPU), "cpu", "cuda", "mps".
    device: str = "auto"
    #: Tokens of a prompt kept before the reply as the drafter's context in training (a long
    #: conversation's earlier turns still shape the target's states; the drafter trains on a window).
    context_tokens: int = 768


@dataclass(frozen=True)
class DistillEvent:
    """``phase``: "data" (texts made / to make), "train" (seconds trained / budget), "saved" (a
    better drafter is on disk), "done"."""

    phase: str
    done: float
    total: float
    message: str
    eta_s: float | None = None
    loss: float | None = None
    tokens_per_pass: float | None = None
    best_tokens_per_pass: float | None = None


def distill(runner_factory: Callable[[], object], target_model, tokenizer, eos_ids: set[int], verifier_name: str,
            prompts: list[list[int]], out: Path, settings: DistillSettings = DistillSettings(),
            cancel: Callable[[], bool] = lambda: False) -> Iterator[DistillEvent]:
    out = Path(out)
    device = training.training_device(settings.device)
    work = out / "training"
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    samples = yield from _data(runner_factory, target_model, tokenizer, eos_ids, prompts, work, settings, cancel)
    data_s = time.perf_counter() - started
    if len(samples) < 2:
        yield DistillEvent("done", 0, 0, "not enough text to train on (need at least two texts)")
        return
    heldout, train_set = split(samples, settings.heldout_share, settings.seed)
    held = len(heldout)
    counts = Counter()
    for s in train_set:
        counts.update(s.labels[s.first:].tolist())
    config = target_model.config
    spec = new_drafter.spec_for_target(config, verifier_name, settings.draft_vocab, settings.inner, settings.aux_layers)
    ids = new_drafter.draft_vocabulary(counts, spec.layers.vocab_size, spec.draft_vocab_size)
    decoder = target_model.get_decoder()
    layers = new_drafter.new_drafter(spec, ids, target_model.get_output_embeddings(),
                                     decoder.norm.weight.detach(), seed=settings.seed).to(device)
    embed = target_model.get_input_embeddings()
    params = training.trainable(layers)
    optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=0.0)
    state = {"step": 0, "trained_s": 0.0, "best": None, "tokens": 0}
    if (work / STATE).is_file():
        saved = torch.load(work / STATE, map_location="cpu", weights_only=False)
        layers.load_state_dict(saved["layers"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["progress"]
        yield DistillEvent("train", state["trained_s"], settings.minutes * 60,
                           f"resumed after {state['trained_s'] / 60:.1f} min of training")
    baseline = training.evaluate(layers, embed, heldout, settings.steps)
    if state["best"] is None:
        state["best"] = baseline.tokens_per_pass
    # The first run's untrained figure and data time: a resumed run measures neither.
    state.setdefault("untrained", baseline.tokens_per_pass)
    state.setdefault("data_seconds", data_s)
    budget = settings.minutes * 60
    index = training.draft_index(layers)
    autocast = _bf16_matmuls(device)
    record = {"texts": len(samples), "tokens": sum(len(s) for s in samples), "data_seconds": round(state["data_seconds"], 1),
              "replies": sum(s.kind == "reply" for s in samples), "top_k": settings.top_k, "device": device.type,
              "sampled_replies": settings.sampled_replies,
              "heldout_texts": held, "untrained_tokens_per_pass": round(state["untrained"], 3)}

    def finished() -> bool:
        return state["trained_s"] >= budget or (settings.max_steps is not None and state["step"] >= settings.max_steps)

    def total_steps() -> int:
        """The schedule's length: the step limit, else what the time budget holds at the pace so far."""
        if settings.max_steps is not None:
            return settings.max_steps
        return max(int(budget / max(_step_estimate(state), 1e-3)), 50)

    def checkpoint():
        """Score on the held-out texts, save the drafter when it is the best so far, save the state."""
        scores = training.evaluate(layers, embed, heldout, settings.steps)
        seen = training.evaluate(layers, embed, seen_set, settings.steps)
        yield DistillEvent("train", state["trained_s"], budget,
                           f"step {state['step']}: training texts {seen.tokens_per_pass:.3f} tokens a pass, loss {seen.loss:.3f}",
                           max(budget - state["trained_s"], 0.0), scores.loss, scores.tokens_per_pass, state["best"])
        if scores.tokens_per_pass > state["best"] or not (out / "config.json").is_file():
            state["best"] = max(scores.tokens_per_pass, state["best"])
            save.save_speculators(layers, out, {**record, "trained_seconds": round(state["trained_s"], 1), "steps": state["step"],
                                                "heldout_tokens_per_pass": round(scores.tokens_per_pass, 3)})
            yield DistillEvent("saved", state["trained_s"], budget, f"held-out {scores.tokens_per_pass:.3f} tokens a pass",
                               tokens_per_pass=scores.tokens_per_pass, best_tokens_per_pass=state["best"])
        partial = work / (STATE + ".partial")
        torch.save({"layers": layers.state_dict(), "optimizer": optimizer.state_dict(), "progress": state}, partial)
        partial.replace(work / STATE)

    # The training texts scored beside the held-out ones: replies where there are, as many.
    seen_set = ([s for s in train_set if s.kind == "reply"] or train_set)[: len(heldout)]
    last_checkpoint = time.perf_counter()
    stopped = False
    while not finished():
        if cancel():
            stopped = True
            break
        t0 = time.perf_counter()
        sample = train_set[state["step"] % len(train_set)]
        for group in optimizer.param_groups:
            group["lr"] = training.learning_rate(state["step"], total_steps(), settings.learning_rate)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, _, _ = training.unrolled(layers, embed, sample, index, settings.steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state["step"] += 1
        state["tokens"] += len(sample)
        state["trained_s"] += time.perf_counter() - t0
        if state["step"] % len(train_set) == 0 or time.perf_counter() - last_checkpoint > settings.checkpoint_minutes * 60:
            yield from checkpoint()
            last_checkpoint = time.perf_counter()
    if stopped or state["step"] % len(train_set):
        yield from checkpoint()  # stopped, or ended between two scorings: keep what it reached
    how = "stopped" if stopped else "done"
    yield DistillEvent("done", state["trained_s"], budget, f"{how}: best held-out {state['best']:.3f} tokens a pass (untrained "
                       f"{state['untrained']:.3f}); saved in {out}", best_tokens_per_pass=state["best"])


def split(samples: list[Sample], share: float, seed: int) -> tuple[list[Sample], list[Sample]]:
    """(held out, trained on): ``share`` of the target's own replies (at least one) are held out,
    so the held-out figure measures drafting in chat; every text file's window is trained on.
    Replies to the same prompt (a greedy one and sampled ones) are held out together, so the
    figure is never of a prompt trained on, and only the greedy one is scored. Without replies
    (or with one), a share of all samples. The trained ones are in a seeded random order."""
    rng = random.Random(seed)
    order = list(range(len(samples)))
    rng.shuffle(order)
    replies = [i for i in order if samples[i].kind == "reply"]
    pool = replies if len(replies) >= 2 else order

    def prompt_of(i: int):
        s = samples[i]
        return tuple(s.tokens[: s.first].tolist()) if s.kind == "reply" and s.first > 0 else i

    prompt = {i: prompt_of(i) for i in pool}  # each computed once
    groups = list(dict.fromkeys(prompt[i] for i in pool))  # in the shuffled order
    held_groups = set(groups[: max(1, int(len(groups) * share))])
    apart = {i for i in pool if prompt[i] in held_groups}
    # Of a held-out prompt's replies the first made (its greedy one) is scored, so the figure
    # means the same with sampled replies or without; the others are not trained on either.
    first_made = {}
    for i in sorted(apart):
        first_made.setdefault(prompt[i], i)
    held = set(first_made.values())
    return [samples[i] for i in order if i in held], [samples[i] for i in order if i not in apart]


def _step_estimate(state: dict) -> float:
    return state["trained_s"] / state["step"] if state["step"] else 1.0


def _bf16_matmuls(device: torch.device) -> bool:
    """Train in bf16 where the device multiplies bf16 natively (a CUDA GPU that has it; a CPU with
    AMX or AVX-512 BF16); fp32 elsewhere, where bf16 matmuls are emulated and slower than fp32 ones."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def _data(runner_factory, target_model, tokenizer, eos_ids, prompts, work: Path, settings: DistillSettings, cancel):
    """The teacher's samples: read from ``work`` when an earlier run made them. Made samples
    are kept in shards as they come (every SHARD_SAMPLES or SHARD_SECONDS), so a run stopped or
    killed while making data resumes after the last shard; complete, the shards stay and a list of
    them marks the data done (writing it all again as one file cost its size twice on disk)."""
    samples = read_data(work)
    if samples is not None:
        yield DistillEvent("data", len(samples), len(samples), f"{len(samples)} texts from an earlier run")
        return samples
    aux = settings.aux_layers or default_aux_layers(target_model.config.get_text_config().num_hidden_layers)
    texts = list(teacher.text_windows(teacher.text_files(settings.text_files), tokenizer, limit_tokens=settings.text_tokens,
                                      per_file=settings.windows_per_file, seed=settings.seed))
    # Every prompt's greedy reply first, then the rounds of sampled ones (each with its own seed).
    asks = [(p, None) for p in prompts] + [(p, settings.seed * 7919 + r * 100_003 + i) for r in
                                           range(1, settings.sampled_replies + 1) for i, p in enumerate(prompts)]
    shards = sorted(work.glob(SHARDS))
    samples: list[Sample] = [s for shard in shards for s in _read_samples(shard)]
    done = Counter(s.kind for s in samples)
    if samples:
        yield DistillEvent("data", len(samples), len(asks) + len(texts),
                           f"{done['reply']} replies and {done['text']} texts from an earlier run")
    total = len(asks) + len(texts)
    started_all = time.perf_counter()
    fresh: list[Sample] = []
    last_shard = time.perf_counter()

    def keep_shard():
        nonlocal fresh, last_shard
        if fresh:
            shard = work / f"data-{len(shards):05d}.pt"
            _write_samples(fresh, shard)
            shards.append(shard)
        fresh, last_shard = [], time.perf_counter()

    def out_of_time() -> bool:
        return settings.data_minutes is not None and time.perf_counter() - started_all > settings.data_minutes * 60

    stopped = out_of_time_stop = False
    replies = teacher.own_replies(runner_factory, [p for p, _ in asks[done["reply"]:]], tokenizer, eos_ids,
                                  settings.reply_tokens, cancel, seeds=[seed for _, seed in asks[done["reply"]:]],
                                  temperature=SAMPLED_TEMPERATURE)
    sources = {"reply": replies, "text": iter(texts[done["text"]:])}
    counts = {"reply": len(asks), "text": len(texts)}
    made, made_now, spent = Counter(done), Counter(), Counter()
    # Two kinds of work at two paces: a reply is written a token a pass, a text read in chunks.
    # They come interleaved in proportion (the kind furthest behind its share next), so a run
    # stopped early, or a data time limit, leaves some of both.
    while True:
        open_kinds = [k for k in ("reply", "text") if made[k] < counts[k]]
        if not open_kinds:
            break
        kind = min(open_kinds, key=lambda k: made[k] / counts[k])
        if cancel():
            stopped = True
            break
        if out_of_time():
            out_of_time_stop = True
            break
        started = time.perf_counter()
        try:
            made_one = next(sources[kind])
        except StopIteration:  # replies stop early only when cancelled
            counts[kind] = made[kind]
            continue
        if isinstance(made_one, str):  # a prompt the target could not answer: said, and passed over
            counts[kind] -= 1
            total -= 1
            yield DistillEvent("data", len(samples), total, f"{kind} {made[kind] + 1} left out: {made_one}")
            continue
        tokens, first = made_one
        sample = teacher.teach(runner_factory(), tokens, aux, first, settings.top_k, kind, settings.context_tokens)
        samples.append(sample)
        fresh.append(sample)
        made[kind] += 1
        made_now[kind] += 1
        spent[kind] += time.perf_counter() - started
        if len(fresh) >= SHARD_SAMPLES or time.perf_counter() - last_shard > SHARD_SECONDS:
            keep_shard()
        eta = sum(spent[k] / made_now[k] * (counts[k] - made[k]) for k in counts if made_now[k])
        yield DistillEvent("data", len(samples), total, f"{kind} {made[kind]} of {counts[kind]}", eta_s=eta)
    keep_shard()
    if stopped or cancel():  # a stopped run's data is not all there: the next one goes on from its shards
        return samples
    if out_of_time_stop:
        yield DistillEvent("data", len(samples), total, f"data time ({settings.data_minutes:g} min) spent: "
                           f"{sum(s.kind == 'reply' for s in samples)} replies and {sum(s.kind == 'text' for s in samples)} texts")
    done_path = work / DATA_DONE
    partial = done_path.with_name(done_path.name + ".partial")
    partial.write_text(json.dumps({"shards": [shard.name for shard in shards], "samples": len(samples)}))
    partial.replace(done_path)
    return samples


def read_data(work: Path) -> list[Sample] | None:
    """The complete data an earlier run made in ``work``, in the order it was made; None when
    there is none (or only a stopped run's shards, which ``_data`` goes on from)."""
    done_path = work / DATA_DONE
    if done_path.is_file():
        return [s for name in json.loads(done_path.read_text())["shards"] for s in _read_samples(work / name)]
    if (work / LEGACY_DATA).is_file():
        return _read_samples(work / LEGACY_DATA)
    return None


SHARDS = "data-*.pt"
SHARD_SAMPLES = 64
SHARD_SECONDS = 120.0


def _write_samples(samples: list[Sample], path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    torch.save([{"aux": s.aux, "tokens": s.tokens, "labels": s.labels, "first": s.first, "top_ids": s.top_ids,
                 "top_probs": s.top_probs, "kind": s.kind} for s in samples], partial)
    partial.replace(path)


def _read_samples(path: Path) -> list[Sample]:
    return [Sample(**s) for s in torch.load(path, map_location="cpu", weights_only=False)]
