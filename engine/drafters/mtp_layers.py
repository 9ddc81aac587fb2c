"""In-checkpoint MTP layers (DeepSeek-V3, GLM-4.5/4.6 and other ``num_mtp_layers`` families) as a
drafter, through transformers' own ``MtpModel`` and ``MtpCache``.

An MTP layer at main position j reads the target's final hidden state h_j and the embedding of
the token after it, x_{j+1}, and predicts x_{j+2}:

    e   = eh_proj(cat(enorm(E[x_{j+1}]), hnorm(h_j)))       [1, n, H]
    o_j = post_norm(decoder_block(e, position j + 1))        [1, n, H]   own causal KV cache
    logits = lm_head(o_j)                                    (the target's head)

Unlike a Gemma 4 assistant it keeps a KV cache of its own, one entry per target position. Each
proposal first adds the entries the target's latest passes made possible (real h_j, accepted
tokens), then drafts k tokens by applying the first MTP layer again with its own output o as the
next h (as vLLM and SGLang chain a single MTP layer); those chained entries are dropped again
afterwards, since the target's next pass supplies real hidden states for them. Checkpoints with
several MTP layers are drafted with their first layer only (transformers runs depth i with layer
i; chaining layer 0 keeps one cache and one rollback rule).
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core.sampler import Sampler
from engine.drafters.base import Draft, DrafterBase
from engine.drafters.kept_states import KeptStates
from engine.models.runners.runner import ModelRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MtpSupport:
    """Whether a loaded target can draft with its own MTP layers here; ``reason`` says why not
    (for the user), or what was found."""

    usable: bool
    reason: str
    layers: int = 0


def _mtp_patterns(model) -> list[str]:
    """Checkpoint key patterns of the MTP layers: the ones the model class declares (it ignores
    them when loading the main model) and, as DeepSeek-V3 and GLM-4.x store them, the layers
    numbered right after the main ones (the class lists only the real checkpoints' numbers)."""
    text = model.config.get_text_config()
    first = text.num_hidden_layers
    own = [rf"model\.layers\.{i}\..*" for i in range(first, first + text.num_mtp_layers)]
    return list(dict.fromkeys([*type(model)._keys_to_ignore_on_load_unexpected, *own]))


def _checkpoint_keys(folder: Path) -> list[str]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return list(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    keys: list[str] = []
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            keys.extend(handle.keys())
    return keys


def inspect_mtp(model) -> MtpSupport:
    """Does this loaded target carry MTP layers that transformers can run? Reads the config and
    the checkpoint's key names only."""
    text = model.config.get_text_config()
    layers = getattr(text, "num_mtp_layers", None) or 0
    if layers < 1:
        return MtpSupport(False, f"{text.model_type} checkpoints have no MTP layers in transformers")
    folder = Path(getattr(model.config, "name_or_path", "") or "")
    if not folder.is_dir():
        return MtpSupport(False, "the model was not loaded from a local folder, so its MTP weights cannot be read")
    pattern = re.compile("|".join(f"({p})" for p in _mtp_patterns(model)))
    if not any(pattern.search(key) for key in _checkpoint_keys(folder)):
        return MtpSupport(False, f"the config declares {layers} MTP layer(s) but the checkpoint has no MTP weights")
    return MtpSupport(True, f"{layers} MTP layer(s) in the checkpoint", layers)


def load_mtp_layers(model):
    """transformers' MtpModel with the MTP weights from ``model``'s own checkpoint folder."""
    from transformers.modeling_layers import MtpModel

    param = next(model.parameters())
    # MtpModel finds the weights through the main model's ignore-list; widen it for this call.
    model._keys_to_ignore_on_load_unexpected = _mtp_patterns(model)
    try:
        mtp = MtpModel.from_pretrained(model, device_map={"": param.device})
    finally:
        del model._keys_to_ignore_on_load_unexpected  # back to the class attribute
    # The MTP layers run on the target's hidden states: same dtype (the config may not say it).
    # (No fast CPU linears here: the layers share the target's LM head, which must stay
    # batch-invariant.)
    return mtp.to(param.dtype).eval()


class MtpLayersDrafter(DrafterBase):
    """Drafts with the target's own MTP layers (see the module docstring)."""

    name = "MTP layers"
    free = False

    def __init__(self, mtp_model) -> None:
        self.mtp = mtp_model
        self.device = next(mtp_model.parameters()).device
        self.target: ModelRunner | None = None
        self.reset()

    def attach_target(self, runner: ModelRunner) -> None:
        runner.capture_hidden = True
        self.target = runner

    def reset(self) -> None:
        from transformers.cache_utils import MtpCache

        self.cache = MtpCache(config=self.mtp.config)
        self.cache.activate_past_recording()  # sliding MTP layers must be able to roll back too
        self.length = 0  # target positions j whose entry (h_j, x_{j+1}) is cached
        self._hidden = KeptStates()  # [n, H] for positions length .. kept - 1

    def prepare(self, prompt: list[int]) -> None:
        # ``prompt`` ends with the first chosen token; the target's prefill computed the rest.
        self._keep_hidden(self.target.length)

    def observe(self, valid_length: int) -> None:
        # The next pass overwrites the target's hidden states: keep the final ones now.
        self._keep_hidden(valid_length)

    def _keep_hidden(self, upto: int) -> None:
        self._hidden.keep(self.target.hidden, self.target.hidden_start, upto, "hidden states")

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        if k <= 0:
            return Draft(())
        seen = self.target.length  # = len(context) - 1: positions 0 .. seen-1 have hidden states
        if seen != len(context) - 1 or self._hidden.kept != seen:
            raise RuntimeError(f"MTP drafter out of step: target holds {seen}, kept {self._hidden.kept}")
        # 1. The real entries: positions length .. seen-1 with their accepted next tokens.
        hidden = self._hidden.take().unsqueeze(0).to(self.device)
        tokens = context[self.length + 1 : seen + 1]
        out = self._step(tokens, hidden, first_position=self.length + 1)
        self.length = seen
        drafted: list[int] = []
        dists: list[torch.Tensor] = []
        for i in range(k):
            token, dist = sampler.choose(self.mtp._project_to_logits(out[:, -1:])[0, -1])
            drafted.append(token)
            if dist is not None:
                dists.append(dist)
            if i + 1 < k:  # 2. chain: the layer's own output stands in for the target's h
                out = self._step([token], out[:, -1:], first_position=seen + 1 + i)
        self.cache.crop(self.length - self.cache.get_seq_length())  # drop the chained entries
        return Draft(tuple(drafted), torch.stack(dists) if dists else None)

    def _step(self, tokens: list[int], hidden: torch.Tensor, first_position: int) -> torch.Tensor:
        """Run MTP layer 0 on entries (hidden [1, n, H], tokens x) at positions first_position..;
        returns its output o [1, n, H] and appends the entries to its cache."""
        ids = torch.tensor([tokens], device=self.device)
        positions = torch.arange(first_position, first_position + len(tokens), device=self.device).unsqueeze(0)
        return self.mtp.forward_layer(0, hidden, positions, self.cache, input_ids=ids)
