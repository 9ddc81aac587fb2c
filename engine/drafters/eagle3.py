"""An EAGLE-3 drafter: one decoder layer of its own over the target's hidden states at three of
its layers (engine.drafters.eagle3_layers), read from the pass the target makes anyway.

The target's runner keeps those states for every row it computes (``aux_layers``); the drafter
keeps one KV entry per target position j, made of (states at j, the token after j). Each
proposal first adds the entries the target's latest passes made possible, then drafts k tokens,
feeding its own output back as the next step's state (as vLLM and SGLang chain EAGLE-3); those
chained entries are overwritten by the next proposal, since the target's next pass gives real
states for their positions. Nothing the drafter does changes what the target accepts.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from engine.core.sampler import Sampler
from engine.drafters.base import Draft, DrafterBase, DrafterMismatch
from engine.drafters.eagle3_layers import Eagle3Layers, load_eagle3_layers
from engine.drafters.kept_states import KeptStates, keep_first
from engine.models.planning.speculators_config import SpeculatorError, SpeculatorSpec, check_belongs_to, read_speculator
from engine.models.runners.interface import Runner


class Eagle3Drafter(DrafterBase):
    free = False

    def __init__(self, layers: Eagle3Layers, aux_layers: tuple[int, ...], embed: torch.nn.Module, name: str = "EAGLE-3") -> None:
        """``embed``: the token embedding the layers read: their own where the checkpoint ships
        one, else the target's (Speculators checkpoints leave it out)."""
        self.layers = layers
        self.aux_layers = tuple(aux_layers)
        self.embed = layers.embed_tokens if layers.embed_tokens is not None else embed
        self.name = name
        self.target: Runner | None = None
        self.vocab = layers.spec.layers.vocab_size
        self._target_ids = layers.target_ids(torch.arange(layers.spec.draft_vocab_size))
        #: Entries a proposal computes at most: older ones are past every later row's window.
        self.read_window = min(layer.self_attn.window for layer in layers.layers)
        self.reset()

    def attach_target(self, runner: Runner) -> None:
        runner.aux_layers = self.aux_layers
        self.target = runner

    def reset(self) -> None:
        self.caches = self.layers.new_caches()
        self.length = 0  # target positions j whose entry (states at j, x_{j+1}) is cached
        self._states = KeptStates()  # [n, 3H] for positions length .. kept - 1
        self.catch_up_s = 0.0

    def keep_prefix(self, n: int) -> int:
        # Entry j holds the states at j with the token at j + 1: it stays valid while both do.
        self.catch_up_s = 0.0
        kept = min(self.length, max(n - 1, 0))
        if kept <= self.caches[0].first:  # what is left was skipped, never computed
            kept = 0
        return keep_first(self, kept)

    def prepare(self, prompt: list[int]) -> None:
        # ``prompt`` ends with the first chosen token; the target's prefill computed the rest.
        self._keep(self.target.length)

    def observe(self, valid_length: int) -> None:
        # The target's next pass replaces its kept states: take the final ones now.
        self._keep(valid_length)

    def _keep(self, upto: int) -> None:
        self._states.keep(self.target.aux, self.target.aux_start, upto, "the drafter's layer states")

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        if k <= 0:
            return Draft(())
        seen = self.target.length  # = len(context) - 1: positions 0 .. seen-1 have states
        if seen != len(context) - 1 or self._states.kept != seen:
            raise RuntimeError(f"EAGLE-3 drafter out of step: target holds {seen}, kept {self._states.kept}")
        started = time.perf_counter()
        # 1. The real entries: positions length .. seen-1 with their accepted next tokens; of a
        # long prompt (or a long stretch with speculation off) only the last window's, since no
        # row from here on attends farther back.
        aux = self._states.take()
        first = max(self.length, seen - self.read_window)
        if first > self.length:
            aux = aux[first - self.length :]
            for cache in self.caches:
                cache.first = first
            self.length = first
        aux = aux.float()
        tokens = torch.tensor(context[self.length + 1 : seen + 1], dtype=torch.long)
        logits, out = self.layers.step(self.layers.combine(aux), self._embed(tokens), self.caches, self.length, outputs=1)
        # More than a pass's worth of entries: the target ran while speculation was off.
        self.catch_up_s = time.perf_counter() - started if len(tokens) > 16 else 0.0
        self.length = seen
        drafted: list[int] = []
        dists: list[torch.Tensor] = []
        for i in range(k):
            token, dist = sampler.choose(self._full_vocabulary(logits[-1]))
            drafted.append(token)
            if dist is not None:
                dists.append(dist)
            if i + 1 < k:  # 2. chain: the layer's own output stands in for the target's states
                logits, out = self.layers.step(out[-1:], self._embed(torch.tensor([token])), self.caches, seen + i)
        return Draft(tuple(drafted), torch.stack(dists) if dists else None)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens).float()

    def _full_vocabulary(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits placed at their target ids; -inf elsewhere (never drafted)."""
        full = torch.full((self.vocab,), float("-inf"))
        full[self._target_ids] = draft_logits.float()
        return full


def load_eagle3_drafter(folder: Path, target_model, target_name: str, target_names: tuple[str, ...] = (),
                        quantize: bool = False) -> Eagle3Drafter:
    """An EAGLE-3 drafter for ``target_model`` from a checkpoint folder; DrafterMismatch (the
    user's message) when it was made for another model or is not one Tandem runs."""
    name = Path(folder).name
    try:
        spec: SpeculatorSpec = read_speculator(folder)
        if spec.algorithm != "eagle3":
            raise SpeculatorError(f"{name} is a {spec.label} drafter; Tandem runs EAGLE-3 checkpoints so far")
        config = target_model.config.get_text_config().to_dict()
        aux_layers = check_belongs_to(spec, config, target_name, name, target_names)
        layers = load_eagle3_layers(folder, spec)
    except SpeculatorError as exc:
        raise DrafterMismatch(str(exc)) from exc
    if quantize:
        from engine.quant.quantize import int8_available, quantize_linears

        if int8_available():
            quantize_linears(layers, include_head=True)
    return Eagle3Drafter(layers, aux_layers, target_model.get_input_embeddings(), name=f"EAGLE-3 ({name})")
