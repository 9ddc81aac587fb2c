"""A loaded target (and optional draft model) ready to serve requests.

This is the engine's front door for the CLI and the app: it turns text or chat messages into
prompt ids with the tokenizer's chat template and starts plain or speculative decoding.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from engine.core.events import Event, Failed, Finished
from engine.core.openmp_pool import release_openmp_workers
from engine.core.settings import DecodeSettings, DrafterOptions, InvalidRequest, Precision, check_prompt, precision_name
from engine.core.threads import ThreadPolicy
from engine.decode.decoding import eos_token_ids, plain_decode, speculative_decode
from engine.drafters import Drafter, DrafterMismatch, DraftModelDrafter, Gemma4AssistantDrafter, PromptLookupDrafter
from engine.drafters.assistant_fit import check_assistant_fits, is_assistant_config
from engine.drafters.lookup_first import LookupFirstDrafter
from engine.drafters.made_for_target import MADE_FOR_TARGET, is_made_for_target_folder, load_made_for_target
from engine.drafters.mtp_layers import MtpLayersDrafter, inspect_mtp, load_mtp_layers
from engine.drafters.reduced_head import ReducedHead
from engine.gguf import is_gguf
from engine.gguf.chat_template import guard
from engine.gguf.resident import CannotKeepResident, Resident, keep_resident
from engine.models.loading.loader import (
    LoadedModel,
    check_model_folder,
    drafter_weights,
    load_model,
    read_config,
    same_vocabulary,
)
from engine.models.loading.placement import check_fits, dtype_for, pick_device, weights_name
from engine.models.runners.prefix_reuse import RunnerPool
from engine.models.runners.runner import ModelRunner

#: "model": the session's drafter (a draft model, an assistant, or a drafter made for the target);
#: "draft_model": the separate draft model, also where one is loaded beside a drafter made for
#: the target, so that the two can be raced on one prompt (side_by_side's ``against``).
DrafterKind = Literal["model", "draft_model", "lookup", "mtp", "off"]

__all__ = ["DrafterKind", "DrafterMismatch", "Session"]

log = logging.getLogger(__name__)


def draft_head(drafter: LoadedModel, options: DrafterOptions) -> ReducedHead | None:
    """The head a draft model drafts from: None keeps the model's own (full, same precision)."""
    from engine.drafters.draft_vocab import load_subset

    int8 = drafter.weights in ("int8", "int4")  # a quantized drafter keeps int8 head rows
    if options.head == "full" and not int8:
        return None
    ids = load_subset(drafter.tokenizer, options.vocab_size) if options.head == "pruned" else None
    if drafter.quantization:  # a GGUF drafter: its full head is the file's rows, a pruned one int8 rows
        from engine.drafters.gguf_head import GgufReducedHead

        return None if ids is None else GgufReducedHead(drafter.model.get_output_embeddings(), ids)
    return ReducedHead(drafter.model.get_output_embeddings().weight, ids, int8=int8)


class Session:
    def __init__(self, target: LoadedModel, drafter: LoadedModel | None = None, drafter_options: DrafterOptions | None = None,
                 made_for_target: Drafter | None = None) -> None:
        """``made_for_target``: a drafter that reads the target's own states (EAGLE-3, DFlash). It
        drafts for the session; a draft model given with it is kept beside it as "draft_model"
        (what it is raced against)."""
        # Chat templates render with limits, a refusal naming the model; the target last, so a
        # tokenizer the two share names the target, whose template renders the prompts.
        for loaded in (drafter, target):
            if loaded is not None:
                guard(loaded.tokenizer, loaded.name)
        # A Gemma 4 assistant ships no tokenizer: it is checked against the target's config.
        assistant = drafter is not None and is_assistant_config(drafter.model.config)
        if assistant and made_for_target is not None:
            raise ValueError(f"{drafter.name} is an assistant: only a draft model can be loaded beside {made_for_target.name}")
        if drafter is not None and not assistant and not same_vocabulary(target.tokenizer, drafter.tokenizer):
            raise DrafterMismatch(
                f"{drafter.name} does not share {target.name}'s tokenizer; it cannot draft for it"
            )
        self.target = target
        self.drafter_model = drafter
        self.tokenizer = target.tokenizer
        self.eos_ids = eos_token_ids(target.model, target.tokenizer)
        self.drafter_options = drafter_options or DrafterOptions()
        self._costs: dict[str, dict] = {}  # per drafter kind: what the last request measured
        #: What drafts as "draft_model": a draft model kept beside a drafter made for the target,
        #: or the session's own draft model (set below); None without a separate draft model.
        self._draft_model_drafting: Drafter | None = None
        if made_for_target is not None:
            self._model_drafter = made_for_target
            if drafter is not None:
                self._draft_model_drafting = self._drafting_of(self._new_draft_model_drafter(drafter))
        elif assistant:
            self._model_drafter = Gemma4AssistantDrafter(drafter.model, target.model, drafter.name, target.name)
        elif drafter is not None:
            self._model_drafter = self._new_draft_model_drafter(drafter)
        else:
            self._model_drafter = None
        self._drafting: Drafter | None = self._drafting_of(self._model_drafter)
        if isinstance(self._model_drafter, DraftModelDrafter):
            self._draft_model_drafting = self._drafting
        self._mtp_drafter: Drafter | None = None
        # The target's caches of recent requests (engine.models.runners.prefix_reuse): a chat's next
        # turn, a regenerate or the server's next request of a conversation prefills only what
        # it adds. Drafters that read transformers' cache and states (MTP layers, an assistant)
        # get a fresh runner each time.
        self.target_caches = RunnerPool(self._new_target_runner)
        # The runner each drafter made for the target (EAGLE-3, DFlash) reads its states from, kept
        # with the drafter's own cache across requests (by the drafter's id).
        self._states_runners: dict[int, object] = {}
        #: Set when a requested drafter was replaced by another one; says why, for the user.
        self.drafter_note: str | None = None
        #: Torch's threads between steps: as many as the cores other programs leave free, at most
        #: the count set when the session was made (engine.core.threads).
        self.threads = ThreadPolicy()

    def _new_draft_model_drafter(self, drafter: LoadedModel) -> DraftModelDrafter:
        return DraftModelDrafter(drafter.model, drafter.name, head=draft_head(drafter, self.drafter_options),
                                 min_confidence=self.drafter_options.min_confidence)

    def _drafting_of(self, drafter: Drafter | None) -> Drafter | None:
        """Prompt lookup takes over from a draft model, or a drafter made for the target, where
        the request copies itself."""
        if isinstance(drafter, (DraftModelDrafter, *MADE_FOR_TARGET)) and self.drafter_options.lookup:
            return LookupFirstDrafter(drafter)
        return drafter

    @classmethod
    def load(cls, target_path: Path, drafter_path: Path | None = None, precision: Precision = "bf16", device: str = "auto",
             drafter_options: DrafterOptions | None = None, draft_model_path: Path | None = None) -> "Session":
        """``draft_model_path``: a draft model to load beside a drafter made for the target
        (``drafter_path``), to race the two; ignored with any other drafter."""
        try:
            return cls._load(target_path, drafter_path, precision, device, drafter_options, draft_model_path)
        finally:
            # Requests may run on another thread (the server's): the OpenMP workers this one
            # started while loading must not slow them (engine.core.openmp_pool).
            release_openmp_workers()

    @classmethod
    def _load(cls, target_path: Path, drafter_path: Path | None, precision: Precision, device: str,
              drafter_options: DrafterOptions | None, draft_model_path: Path | None) -> "Session":
        precision = precision_name(precision)  # an older spelling ("fast", "exact") is mapped
        options = drafter_options or DrafterOptions()
        if is_gguf(target_path):
            if device not in ("auto", "cpu"):
                raise ValueError(f"{Path(target_path).name}: GGUF models run on the CPU only, not on {device}")
            device = "cpu"  # a GGUF model's kernels (and its drafter) run on the CPU
        # Both folders' files first: a missing tokenizer or a truncated weight file is named in
        # milliseconds, not after the other model's load (or as a "drafter mismatch").
        made_for_target = bool(drafter_path) and is_made_for_target_folder(Path(drafter_path))
        beside = Path(draft_model_path) if draft_model_path and made_for_target else None
        for path in (target_path, drafter_path, beside):
            if path and path == drafter_path and made_for_target:
                continue  # such a drafter ships no tokenizer: its loader checks its files
            if path and not Path(path).is_file():  # a folder (a .gguf file is checked by its loader)
                check_model_folder(Path(path), with_tokenizer=path == target_path or not is_assistant_config(read_config(path)))
        dev = pick_device(device)
        if dev.type != "cpu":  # both models together, before either is loaded
            check_fits(Path(target_path), Path(drafter_path) if drafter_path else None, dtype_for(precision, dev), dev,
                       weights=weights_name(precision, dev))
        target = load_model(target_path, precision, str(dev), check_memory=False)
        drafter = None
        if made_for_target:
            names = (target.name, str(getattr(target.model.config, "_name_or_path", "") or ""))
            made = load_made_for_target(Path(drafter_path), target.model, target.name, names,
                                        quantize=options.precision in ("auto", "int8", "int4") and dev.type == "cpu")
            if beside is not None:
                weights = drafter_weights(options.precision, precision, str(dev))
                drafter = load_model(beside, precision, str(dev), role="drafter", weights=weights, check_memory=False)
            return cls(target, drafter, options, made_for_target=made)
        if drafter_path and not is_gguf(drafter_path) and is_assistant_config(read_config(drafter_path)):
            from transformers import AutoConfig

            # Refuse a mismatched assistant before loading its weights.
            check_assistant_fits(target.model.config, AutoConfig.from_pretrained(drafter_path), target.name, Path(drafter_path).name)
            drafter = load_model(drafter_path, precision, str(dev), role="drafter", with_tokenizer=False, check_memory=False)
        elif drafter_path:
            weights = drafter_weights(options.precision, precision, str(dev))
            drafter = load_model(drafter_path, precision, str(dev), role="drafter", weights=weights, check_memory=False)
        return cls(target, drafter, options)

    def keep_weights_resident(self) -> Resident:
        """Lock the GGUF target's memory-mapped weights in RAM (``--mlock``), so that another
        program's memory use cannot push them out to be read back from disk at every step.
        Raises CannotKeepResident saying why where it cannot (a limit; a model already in RAM)."""
        if self.target.gguf_file is None:
            raise CannotKeepResident(f"{self.target.name} is not memory-mapped: its weights are already held in RAM")
        # Matrices the kernels hold in their own layout are in RAM already; their file pages are not read.
        packed = [m.weight_blocks.raw for m in self.target.model.modules()
                  if getattr(getattr(m, "weight_blocks", None), "packed", None) is not None]
        return keep_resident(self.target.gguf_file, held_elsewhere=packed)

    @property
    def model_drafter(self) -> DraftModelDrafter | None:
        return self._model_drafter

    @property
    def drafter_name(self) -> str | None:
        """The drafter model's name, or the made-for-target drafter's ("EAGLE-3 (folder)"); None
        where no model drafts."""
        if isinstance(self._model_drafter, MADE_FOR_TARGET):
            return self._model_drafter.name
        return self.drafter_model.name if self.drafter_model is not None else None

    @property
    def draft_model_name(self) -> str | None:
        """The separate draft model's name where one drafts as "draft_model" (alone, or beside a
        drafter made for the target); None otherwise."""
        return self.drafter_model.name if self._draft_model_drafting is not None else None

    @property
    def has_draft_model_beside(self) -> bool:
        """Whether a draft model is loaded beside a drafter made for the target (the two race)."""
        return self._draft_model_drafting is not None and self._draft_model_drafting is not self._drafting

    @property
    def precision(self) -> str:
        import torch

        if self.target.weights in ("int8", "int4", "file"):
            return self.target.weights
        return "fp32" if self.target.dtype == torch.float32 else "bf16"

    def encode(self, prompt: str | list[dict], chat: bool = True, tools: list[dict] | None = None) -> list[int]:
        """Prompt ids: chat messages (or a single user message) through the chat template when
        the tokenizer has one, with ``tools`` (OpenAI ``tools`` entries) where given; raw text
        otherwise."""
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": check_prompt(prompt)}]
        else:
            messages = prompt
            if not messages:
                raise InvalidRequest("the conversation is empty: type something to send")
            for m in messages:
                if m.get("tool_calls") and not m.get("content"):
                    continue  # an assistant turn that only called tools
                check_prompt(m.get("content", ""), f"the {m.get('role', 'user')} message")
        if chat and getattr(self.tokenizer, "chat_template", None):
            encoded = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                                         return_dict=True)
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
            return self._drafting
        if kind == "draft_model":
            if self._draft_model_drafting is None:
                raise ValueError("no separate draft model is loaded")
            return self._draft_model_drafting
        if kind == "mtp":
            return self._mtp()
        raise ValueError(f"unknown drafter {kind!r}")

    def _mtp(self) -> Drafter:
        """The target's own MTP layers, loaded on first use; prompt lookup when it has none."""
        if self._mtp_drafter is None:
            support = inspect_mtp(self.target.model)
            if support.usable:
                self._mtp_drafter = MtpLayersDrafter(load_mtp_layers(self.target.model))
            else:
                self.drafter_note = f"{self.target.name} has no usable MTP drafter here ({support.reason}); using prompt lookup"
                log.warning(self.drafter_note)
                self._mtp_drafter = PromptLookupDrafter()
        return self._mtp_drafter

    def target_runner(self, drafter=None):
        """A new runner (KV cache) for one request: the side-by-side demo interleaves two requests.

        A quantized (int8 / int4) CPU target runs one fused kernel call per decoder layer
        (FusedRunner) where it can: its PyTorch modules cost ~50 small ops per layer, which was
        ~20% of an int4 decode step. Every part of the fused layer is batch-invariant, so plain
        and speculative decoding on it stay token-identical. Drafters that read the target's own
        hidden states or K/V (``attach_target``) need transformers' cache: ModelRunner then.
        A GGUF target (precision "file") runs its layers without transformers' modules around
        its kernels (GgufRunner), bit for bit what they compute."""
        from engine.models.runners import fused_runner, gguf_runner

        model = self.target.model
        reads_target = drafter is not None and drafter.attach_target is not None
        # EAGLE-3 and DFlash read only the inputs of a few layers, which GgufRunner keeps too.
        inner = drafter.model if isinstance(drafter, LookupFirstDrafter) else drafter
        reads_modules = reads_target and not isinstance(inner, MADE_FOR_TARGET)
        if self.target.weights in ("int8", "int4") and not reads_target and fused_runner.worth_using(model):
            return fused_runner.FusedRunner(model)
        if self.target.weights == "file" and not reads_modules and gguf_runner.worth_using(model):
            return gguf_runner.GgufRunner(model)
        return ModelRunner(model)

    def layer_states_runner(self):
        """A runner that keeps the inputs of chosen layers (``aux_layers``), as drafters made for
        the target read them and ``tandem distill`` teaches from them: the GGUF file's own
        runner where it runs, else transformers' modules (the fused int8 / int4 layers keep none)."""
        from engine.models.runners import gguf_runner

        if self.target.weights == "file" and gguf_runner.worth_using(self.target.model):
            return gguf_runner.GgufRunner(self.target.model)
        return ModelRunner(self.target.model)

    def _new_target_runner(self):
        return self.target_runner()

    def _leased(self, prompt_ids: list[int], drafter, run: Callable) -> Iterator[Event]:
        """Run ``run(runner)`` on the kept cache that shares the most with ``prompt_ids``, and keep
        the cache for the next request when it ends (finished, failed or abandoned)."""
        if drafter is not None and drafter.keep_prefix is not None:
            # A drafter made for the target keeps its cache of the target's states across
            # requests, with the one runner it read them from: a chat's next turn prefills only
            # what it adds, for both.
            runner = self._states_runners.get(id(drafter))
            if runner is None:
                runner = self._states_runners[id(drafter)] = self.target_runner(drafter)
            for event in self.threads.paced(run(runner)):
                if isinstance(event, Failed):  # a pass may have stopped half-way: keep nothing of it
                    runner.reset()
                    drafter.reset()
                yield event
            return
        if drafter is not None and drafter.attach_target is not None:
            yield from self.threads.paced(run(self.target_runner(drafter)))
            return
        runner = self.target_caches.lease(prompt_ids)
        leased = True
        try:
            for event in self.threads.paced(run(runner)):
                if isinstance(event, (Finished, Failed)):
                    if isinstance(event, Failed):
                        # A pass may have stopped half-way through the layers: keep no cache of it.
                        runner.reset()
                    # Released before the last event is handed on: a consumer that stops there
                    # (drain) must not leave the cache leased until the generator is collected.
                    self.target_caches.release(runner)
                    leased = False
                yield event
        finally:
            if leased:
                self.target_caches.release(runner)

    def plain(self, prompt_ids: list[int], settings: DecodeSettings, cancel: Callable[[], bool] = lambda: False) -> Iterator[Event]:
        return self._leased(prompt_ids, None, lambda runner: plain_decode(
            runner, self.tokenizer, prompt_ids, settings, self.eos_ids, cancel))

    def forget_prefixes(self) -> None:
        """Drop every kept cache, the target's and the draft model's: the next request prefills
        its whole prompt, as a first turn does (what compare and bench measure)."""
        self.target_caches.clear()
        for runner in self._states_runners.values():
            runner.reset()
        for drafter in {self._model_drafter, getattr(self._draft_model_drafting, "model", self._draft_model_drafting)}:
            if isinstance(drafter, DraftModelDrafter):
                drafter.forget()

    def forget_costs(self) -> None:
        """Drop what earlier requests measured (a warm-up's figures include one-time costs)."""
        self._costs.clear()

    def speculative(self, prompt_ids: list[int], settings: DecodeSettings, drafter: DrafterKind = "model", cancel: Callable[[], bool] = lambda: False) -> Iterator[Event]:
        chosen = self.drafter(drafter)
        if chosen is None:
            return self.plain(prompt_ids, settings, cancel)
        # Costs measured by earlier requests with this drafter seed the draft length (see
        # DraftLengthController's ``known``).
        costs = self._costs.setdefault(drafter, {})
        return self._leased(prompt_ids, chosen, lambda runner: speculative_decode(
            runner, chosen, self.tokenizer, prompt_ids, settings, self.eos_ids, cancel, costs=costs))
