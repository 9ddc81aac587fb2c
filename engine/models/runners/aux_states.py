"""The inputs of chosen decoder layers, kept from a pass through transformers' modules: what an
EAGLE-3 drafter reads of its target. Layer id i is the input of decoder layer i (the output of
layer i - 1), as vLLM counts; id L (the number of layers) is the last layer's output before the
final norm."""
from __future__ import annotations

import torch


class LayerInputs:
    """Hooks on ``decoder``'s layers (and its final norm, for id L) for one pass; ``rows()`` gives
    the kept states side by side [rows, len(ids) * H], in the order of ``ids``."""

    def __init__(self, decoder: torch.nn.Module, ids: tuple[int, ...]) -> None:
        self.ids = ids
        self.kept: dict[int, torch.Tensor] = {}
        layers = decoder.layers
        self.handles = []
        for i in set(ids):
            module = layers[i] if i < len(layers) else decoder.norm
            self.handles.append(module.register_forward_pre_hook(self._keeper(i), with_kwargs=True))

    def _keeper(self, i: int):
        def keep(module, args, kwargs):
            states = args[0] if args else kwargs["hidden_states"]
            self.kept[i] = states[0]
        return keep

    def rows(self) -> torch.Tensor:
        return torch.cat([self.kept[i] for i in self.ids], dim=-1)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
