"""A loaded target (and optional draft model) ready to serve requests.

This is the engine's front door for the CLI and the app: it turns text or chat messages into
prompt ids with the tokenizer's chat template and starts plain or speculative decoding.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from engine.decoding import eos_token_ids, plain_decode, speculative_decode
from engine.drafters import DraftModelDrafter, Drafter, PromptLookupDrafter
from engine.events import Event
from engine.drafters.reduced_head import ReducedHead
from engine.loading import LoadedModel, drafter_weights, load_model, same_vocabulary
from engine.runner import ModelRunner
from engine.settings import DecodeSettings, DrafterOptions, Precision

DrafterKind = Literal["model", "lookup", "off"]


class DrafterMismatch(ValueError):
    pass


def draft_head(drafter: LoadedModel, options: DrafterOptions) -> ReducedHead | None:
    """The head a draft model drafts from: None keeps the model's own (full, same precision)."""
    from engine.draft_vocab import load_subset

    int8 = drafter.weights == "int8"
    if options.head == "full" and not int8:
        return None
    ids = load_subset(drafter.tokenizer, options.vocab_size) if options.head == "pruned" else None
    return ReducedHead(drafter.model.get_output_embeddings().weight, ids, int8=int8)


class Session:
    def __init__(self, target: LoadedModel, drafter: LoadedModel | None = None, drafter_options: DrafterOptions | None = None) -> None:
        if drafter is not None and not same_vocabulary(target.tokenizer, drafter.tokenizer):
            raise DrafterMismatch(
                f"{drafter.name} does not share {target.name}'s tokenizer; it cannot draft for it"
            )
        self.target = target
        self.drafter_model = drafter
        self.tokenizer = target.tokenizer
        self.eos_ids = eos_token_ids(target.model, target.tokenizer)
        self._target_runner = ModelRunner(target.model)
        self.drafter_options = drafter_options or DrafterOptions()
        self._model_drafter = None
        if drafter is not None:
            head = draft_head(drafter, self.drafter_options)
            self._model_drafter = DraftModelDrafter(drafter.model, drafter.name, head=head)

    @classmethod
    def load(cls, target_path: Path, drafter_path: Path | None = None, precision: Precision = "fast", device: str = "auto", drafter_options: DrafterOptions | None = None) -> "Session":
        options = drafter_options or DrafterOptions()
        target = load_model(target_path, precision, device)
        drafter = None
        if drafter_path:
            weights = drafter_weights(options.precision, precision, device)
            drafter = load_model(drafter_path, precision, device, role="drafter", weights=weights)
        return cls(target, drafter, options)

    @property
    def model_drafter(self) -> DraftModelDrafter | None:
        return self._model_drafter

    @property
    def precision(self) -> str:
        import torch

        return "exact" if self.target.dtype == torch.float32 else "fast"

    def encode(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        """Prompt ids: chat messages (or a single user message) through the chat template when
        the tokenizer has one; raw text otherwise."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("the prompt is empty: type something to send")
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = prompt
        if chat and getattr(self.tokenizer, "chat_template", None):
            encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
            return list(encoded["input_ids"])
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in messages)
        return self.tokenizer(text)["input_ids"]

    def drafter(self, kind: DrafterKind) -> Drafter | None:
        if kind == "off":
            return None
        if kind == "lookup":
            return PromptLookupDrafter()
        if kind == "model":
            if self._model_drafter is None:
                raise ValueError("no draft model is loaded; use prompt lookup or load a drafter")
            return self._model_drafter
        raise ValueError(f"unknown drafter {kind!r}")

    def plain(self, prompt_ids: list[int], settings: DecodeSettings, cancel: Callable[[], bool] = lambda: False) -> Iterator[Event]:
        return plain_decode(self._target_runner, self.tokenizer, prompt_ids, settings, self.eos_ids, cancel)

    def speculative(self, prompt_ids: list[int], settings: DecodeSettings, drafter: DrafterKind = "model", cancel: Callable[[], bool] = lambda: False) -> Iterator[Event]:
        chosen = self.drafter(drafter)
        if chosen is None:
            return self.plain(prompt_ids, settings, cancel)
        return speculative_decode(self._target_runner, chosen, self.tokenizer, prompt_ids, settings, self.eos_ids, cancel)
