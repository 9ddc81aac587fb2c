"""What the target teaches its drafter: for each token of a text, the target's states at the
drafter's three layers and the target's own greedy choice of the next token.

Texts come from the target itself (its replies to prompts: the distribution the drafter will
draft in) or from files on disk, read teacher-forced. One pass over each text through the
target's runner gives both (the runners keep the named layers' inputs, engine.models.runners).
"""
from __future__ import annotations

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

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def teach(runner: Runner, tokens: list[int], aux_layers: tuple[int, ...], first: int = 0) -> Sample:
    """One teacher-forced pass (in chunks) of ``tokens`` through the target; labels before
    ``first`` are context only."""
    runner.reset()
    runner.aux_layers = tuple(aux_layers)
    aux, labels = [], []
    with torch.inference_mode():
        for start in range(0, len(tokens), CHUNK):
            piece = tokens[start : start + CHUNK]
            logits = runner.forward(piece, n_logits=len(piece))
            if runner.aux is None:
                raise RuntimeError(f"{type(runner).__name__} keeps no layer states: teach from a runner that does")
            aux.append(runner.aux[-len(piece):].to(torch.bfloat16).clone())
            labels.append(logits.argmax(-1))
    runner.aux_layers = ()
    runner.reset()
    return Sample(torch.cat(aux), torch.tensor(tokens, dtype=torch.long), torch.cat(labels), first)


def own_replies(runner_factory: Callable[[], Runner], prompts: Iterable[list[int]], tokenizer, eos_ids: set[int],
                max_new_tokens: int, cancel: Callable[[], bool] = lambda: False) -> Iterator[tuple[list[int], int]]:
    """(prompt + the target's greedy reply, the index of the first label a draft could give: the
    reply's second token, since the target chose its first at the prefill) for each
    prompt (plain decoding on a fresh runner)."""
    from engine.core.events import Finished
    from engine.decode.decoding import plain_decode

    for prompt in prompts:
        if cancel():
            return
        settings = DecodeSettings(max_new_tokens=max_new_tokens)
        for event in plain_decode(runner_factory(), tokenizer, prompt, settings, eos_ids, cancel):
            if isinstance(event, Finished):
                yield list(prompt) + list(event.token_ids), len(prompt)
                break


def text_windows(paths: Iterable[Path], tokenizer, window: int = 512,
                 limit_tokens: int | None = None) -> Iterator[tuple[list[int], int]]:
    """Token windows of the text files given (UTF-8; others skipped), up to ``limit_tokens``."""
    total = 0
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = tokenizer(text)["input_ids"]
        for start in range(0, max(len(ids) - 16, 0), window):
            piece = ids[start : start + window]
            if limit_tokens is not None and total + len(piece) > limit_tokens:
                return
            total += len(piece)
            yield piece, 0
