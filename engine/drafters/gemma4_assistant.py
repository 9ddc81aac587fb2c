"""Gemma 4 assistant (MTP) drafter: a few query-only layers that read the target's own K/V.

One draft step, for the token y that the target has chosen but not yet fed (at position p):

    x      = cat(E_target[y], h)                  [1, 1, 2H]   h: target final hidden at p - 1
    logits = assistant(x, position p, K/V)         [1, 1, V]    pre_projection, layers whose
                                                               queries attend to the target's
                                                               cached K/V, lm_head (or the
                                                               centroid-masked head of E2B/E4B)
    h      = post_projection(assistant hidden)     [1, 1, H]    the next step's h
    y      = the drafted token                                 (argmax, or drawn from q)

k steps propose k tokens; the position stays p and the K/V stay the target's (positions < p),
so the assistant keeps no cache and nothing of it needs rolling back. After verification the
target's pass over the accepted tokens provides the next h and K/V, so the loop's invariant
(target cache = every token but the last) is all the state there is.

K/V seen: every cached position for full-attention layers; for sliding layers the positions a
target query at p would see, p - window + 1 .. p - 1. (transformers' candidate generator differs
in two small ways that only affect draft quality, never the output: after a rejection it keeps
the rejected draft's K/V at position p, and its sliding mask admits window + 1 entries.)
"""
from __future__ import annotations

import logging

import torch

from engine.core.sampler import Sampler
from engine.drafters.assistant_fit import SharedKV, check_assistant_fits
from engine.drafters.base import Draft, DrafterBase
from engine.models.runners.runner import ModelRunner

log = logging.getLogger(__name__)


class Gemma4AssistantDrafter(DrafterBase):
    """Drafts with a ``Gemma4AssistantForCausalLM`` for a Gemma 4 target (Gemma4ForCausalLM or
    a text-only Gemma4ForConditionalGeneration). Raises AssistantMismatch when it does not fit."""

    free = False

    def __init__(self, assistant, target_model, name: str = "gemma 4 assistant", target_name: str = "the target") -> None:
        self.shared: SharedKV = check_assistant_fits(target_model.config, assistant.config, target_name, name)
        self.assistant = assistant
        self.name = name
        # The assistant's input embeds the token with the *target's* (scaled) embedding table.
        self.embed = target_model.get_input_embeddings()
        self.device = next(assistant.parameters()).device
        self.target: ModelRunner | None = None

    def attach_target(self, runner: ModelRunner) -> None:
        """Read hidden states and K/V from this request's target runner (from its prefill on)."""
        runner.capture_hidden = True
        self.target = runner

    def reset(self) -> None:
        pass

    def prepare(self, prompt: list[int]) -> None:
        pass  # the target's prefill is the assistant's too

    def observe(self, valid_length: int) -> None:
        pass  # no cache of its own: the target's crop is the rollback

    def shared_kv(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{layer type: (K, V)}, each [1, kv_heads, n, head_dim], the target's cached states
        for the positions a query at the next position may attend to."""
        kv = {}
        for layer_type, layer in self.shared.layers:
            keys, values = self.target.cached_kv(layer)
            if layer_type == "sliding_attention":
                keep = self.shared.sliding_window - 1
                keys, values = keys[:, :, -keep:], values[:, :, -keep:]
            kv[layer_type] = (keys, values)
        return kv

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        if k <= 0:
            return Draft(())
        target = self.target
        if target is None:
            raise RuntimeError("the assistant drafter has no target runner (attach_target was not called)")
        position = target.length  # of context[-1]: chosen by the target, not yet fed to it
        if position != len(context) - 1:
            raise RuntimeError(f"target cache holds {position} tokens, expected {len(context) - 1}")
        hidden = target.hidden_at(position - 1).view(1, 1, -1).to(self.device)
        kv = self.shared_kv()
        position_ids = torch.tensor([[position]], device=self.device)
        token = context[-1]
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        for _ in range(k):
            ids = torch.tensor([[token]], device=self.embed.weight.device)
            embeds = torch.cat([self.embed(ids).to(self.device), hidden], dim=-1)
            out = self.assistant(inputs_embeds=embeds, position_ids=position_ids, shared_kv_states=kv)
            token, dist = sampler.choose(out.logits[0, -1])
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
            hidden = out.last_hidden_state
        return Draft(tuple(tokens), torch.stack(dists) if dists else None)
