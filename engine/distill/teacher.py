"""What the target teaches its drafter: for each token of a text, the target's states at the
drafter's three layers and the target's own greedy choice of the next token.

Texts come from the target itself (its replies to prompts: the distribution the drafter will
draft in) or from files on disk, read teacher-forced. One pass over each text through the
target's runner gives both (the runners keep the named layers' inputs, engine.models.runners).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core.settings import DecodeSettings
from engine.models.runners.interface import Runner

#: Rows per teacher pass: bounds the [rows, vocabulary] logits a pass returns.
CHUNK = 256


@dataclass(frozen=True)
class Sample:
    """One text as the drafter trains on it."""

    #: [T, 3H] bf16: the target's states at the drafter's layers for each position.
    aux: torch.Tensor
    #: [T] the text's tokens.
    tokens: torch.Tensor
    #: [T] the target's greedy token after each position (what a draft must match).
    labels: torch.Tensor
    #: The first label that counts: a reply's own tokens are what the drafter will draft; the
    #: prompt before it (the chat template, the question) is context only.
    first: int = 0
    #: [T, k] int32: the target's k likeliest next tokens at each position (None: argmax only).
    top_ids: torch.Tensor | None = None
    #: [T, k] fp16: their probabilities under the target's full softmax (not renormalized).
    top_probs: torch.Tensor | None = None
    #: "reply" (the target's own reply to a prompt) or "text" (a file read teacher-forced).
    kind: str = "text"

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def teach(runner: Runner, tokens: list[int], aux_layers: tuple[int, ...], first: int = 0, top_k: int = 0,
          kind: str = "text", context_tokens: int | None = None) -> Sample:
    """One teacher-forced pass (in chunks) of ``tokens`` through the target; labels before
    ``first`` are context only. ``top_k``: keep the target's k likeliest next tokens and their
    probabilities too (the drafter then learns the target's distribution, not only its argmax).
    ``context_tokens``: of the context before ``first``, keep only the last this many (the
    target still reads all of it, so the kept states are the ones it has in a long chat; the
    drafter trains on a window of them, which bounds the memory and time a long prompt costs)."""
    runner.reset()
    runner.aux_layers = tuple(aux_layers)
    aux, labels, top_ids, top_probs = [], [], [], []
    with torch.inference_mode():
        for start in range(0, len(tokens), CHUNK):
            piece = tokens[start : start + CHUNK]
            logits = runner.forward(piece, n_logits=len(piece))
            if runner.aux is None:
                raise RuntimeError(f"{type(runner).__name__} keeps no layer states: teach from a runner that does")
            aux.append(runner.aux[-len(piece):].to(torch.bfloat16).clone())
            labels.append(logits.argmax(-1))
            if top_k:
                logits = logits.float()
                values, ids = logits.topk(top_k, dim=-1)
                top_ids.append(ids.to(torch.int32))
                top_probs.append((values - logits.logsumexp(-1, keepdim=True)).exp().to(torch.float16))
    runner.aux_layers = ()
    runner.reset()
    cut = max(first - context_tokens, 0) if context_tokens is not None else 0
    tops = (torch.cat(top_ids)[cut:].clone(), torch.cat(top_probs)[cut:].clone()) if top_k else (None, None)
    return Sample(torch.cat(aux)[cut:].clone(), torch.tensor(tokens[cut:], dtype=torch.long), torch.cat(labels)[cut:].clone(),
                  first - cut, *tops, kind=kind)


def own_replies(runner_factory: Callable[[], Runner], prompts: Iterable[list[int]], tokenizer, eos_ids: set[int],
                max_new_tokens: int, cancel: Callable[[], bool] = lambda: False, seeds: Iterable[int | None] | None = None,
                temperature: float = 0.7) -> Iterator[tuple[list[int], int] | str]:
    """(prompt + the target's reply, the index of the first label a draft could give: the
    reply's second token, since the target chose its first at the prefill) for each
    prompt (plain decoding on a fresh runner); for a prompt the target refused (one longer than
    its context window), why, so the caller can say so and go on. The reply is greedy, or
    sampled at ``temperature`` where ``seeds`` gives the prompt a seed."""
    from itertools import repeat

    from engine.core.events import Failed, Finished
    from engine.decode.decoding import plain_decode

    for prompt, seed in zip(prompts, repeat(None) if seeds is None else seeds):
        if cancel():
            return
        settings = (DecodeSettings(max_new_tokens=max_new_tokens) if seed is None else
                    DecodeSettings(mode="sample", temperature=temperature, seed=seed, max_new_tokens=max_new_tokens))
        for event in plain_decode(runner_factory(), tokenizer, prompt, settings, eos_ids, cancel):
            if isinstance(event, Finished):
                yield list(prompt) + list(event.token_ids), len(prompt)
                break
            if isinstance(event, Failed):
                if cancel():
                    return
                yield event.error
                break


#: File names read as text where --text names a folder.
TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt", ".c", ".h", ".cc", ".cpp", ".js", ".ts", ".sh", ".toml", ".cfg", ".html")


def text_files(paths: Iterable[Path]) -> list[Path]:
    """The files ``paths`` name: files as given, folders as every file under them with a text
    suffix (TEXT_SUFFIXES), in sorted order."""
    files: list[Path] = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
        else:
            files.append(path)
    return files


def text_windows(paths: Iterable[Path], tokenizer, window: int = 512, limit_tokens: int | None = None,
                 per_file: int = 2, seed: int = 0, max_chars: int = 200_000) -> Iterator[tuple[list[int], int]]:
    """Token windows of the text files given (UTF-8; others skipped), up to ``limit_tokens``,
    spread across the files: the files in a seeded random order, at most ``per_file`` windows
    of each (chosen at random in it) first, then, when the limit is not reached, the files'
    other windows. Of a file larger than ``max_chars``, a random slice that long is read."""
    rng = random.Random(seed)
    files = list(paths)
    rng.shuffle(files)
    total = 0
    rest: list[list[int]] = []
    for path in files:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) > max_chars:
            start = rng.randrange(len(text) - max_chars)
            text = text[start : start + max_chars]
        ids = tokenizer(text)["input_ids"]
        pieces = [ids[start : start + window] for start in range(0, max(len(ids) - 16, 0), window)]
        chosen = set(rng.sample(range(len(pieces)), min(per_file, len(pieces))))
        for n, piece in enumerate(pieces):
            if n not in chosen:
                rest.append(piece)
                continue
            if limit_tokens is not None and total + len(piece) > limit_tokens:
                return
            total += len(piece)
            yield piece, 0
    rng.shuffle(rest)
    for piece in rest:
        if limit_tokens is not None and total + len(piece) > limit_tokens:
            return
        total += len(piece)
        yield piece, 0
