"""Does a Gemma 4 assistant fit a target? Checked on the two configs, before any weights load.

An assistant reads the target's own K/V (of the last layer of each attention type that stores
them) and its last hidden state, so everything that shapes those tensors or their positions must
agree: vocabulary, ``backbone_hidden_size`` = the target's hidden size, KV heads and head dim per
attention type, the sliding window and the rotary embedding. A mismatch is refused with the
field that differs rather than failing inside a matmul (or, worse, drafting garbage).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.drafters.base import DrafterMismatch

ASSISTANT_MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
ASSISTANT_ARCHITECTURES = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")


class AssistantMismatch(DrafterMismatch):
    """``field``: the config field that differs (e.g. "backbone_hidden_size")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SharedKV:
    """Where the assistant's K/V come from: for each attention type it uses, the index of the
    target decoder layer that stores them; the sliding window those layers see."""

    layers: tuple[tuple[str, int], ...]
    sliding_window: int | None


def is_assistant_config(config: dict | object) -> bool:
    """True for a Gemma 4 assistant checkpoint's config (a config object or config.json dict)."""
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    return get("model_type") in ASSISTANT_MODEL_TYPES or any(
        arch in ASSISTANT_ARCHITECTURES for arch in (get("architectures") or ())
    )


def _rope(text_config, layer_type: str) -> dict:
    """The rotary parameters of one layer type, with defaults made explicit so that two configs
    that spell the same rope differently compare equal."""
    params = dict((text_config.rope_parameters or {}).get(layer_type) or {})
    params.setdefault("rope_type", "default")
    params.setdefault("partial_rotary_factor", 1.0)
    return params


def _differ(field: str, what: str, ours, theirs, names: tuple[str, str]) -> AssistantMismatch:
    assistant, target = names
    return AssistantMismatch(
        field,
        f"{assistant} does not fit {target}: {what} is {ours!r} for the assistant but {theirs!r} "
        f"for the target ({field} differs); use the assistant made for this model",
    )


def check_assistant_fits(target_config, assistant_config, target_name: str = "the target", assistant_name: str = "the assistant") -> SharedKV:
    """Raise AssistantMismatch naming the first field that differs; return the K/V layout."""
    names = (assistant_name, target_name)
    if not is_assistant_config(assistant_config):
        raise AssistantMismatch("model_type", f"{assistant_name} is not a Gemma 4 assistant checkpoint")
    t = target_config.get_text_config()
    a = assistant_config.get_text_config()
    modes = getattr(t, "kv_sharing_modes", None)
    if not str(getattr(t, "model_type", "")).startswith("gemma4") or modes is None:
        raise AssistantMismatch(
            "model_type",
            f"{assistant_name} drafts for Gemma 4 models, but {target_name} is a "
            f"{getattr(t, 'model_type', 'different')} model",
        )
    if a.vocab_size != t.vocab_size:
        raise _differ("vocab_size", "the vocabulary size", a.vocab_size, t.vocab_size, names)
    if assistant_config.backbone_hidden_size != t.hidden_size:
        raise _differ("backbone_hidden_size", "the hidden size it reads (backbone_hidden_size vs the target's hidden_size)",
                      assistant_config.backbone_hidden_size, t.hidden_size, names)
    stores = {}
    for index, (layer_type, mode) in enumerate(zip(t.layer_types, modes)):
        if mode == "store":
            stores[layer_type] = index
    used = list(dict.fromkeys(a.layer_types))
    for layer_type in used:
        if layer_type not in stores:
            raise AssistantMismatch("layer_types", f"{assistant_name} attends with {layer_type} layers, but "
                                                   f"{target_name} stores no K/V of that type")
        ours = a.per_layer_config[a.layer_types.index(layer_type)]
        theirs = t.per_layer_config[stores[layer_type]]
        for field in ("head_dim", "num_key_value_heads"):
            if getattr(ours, field) != getattr(theirs, field):
                raise _differ(field, f"{field} of {layer_type} layers", getattr(ours, field), getattr(theirs, field), names)
        rope_a, rope_t = _rope(a, layer_type), _rope(t, layer_type)
        if rope_a != rope_t:
            raise _differ("rope_parameters", f"the rotary embedding of {layer_type} layers", rope_a, rope_t, names)
    window = t.sliding_window if "sliding_attention" in used else None
    if window is not None and a.sliding_window != t.sliding_window:
        raise _differ("sliding_window", "the sliding window", a.sliding_window, t.sliding_window, names)
    if getattr(assistant_config, "use_ordered_embeddings", False) and a.vocab_size % assistant_config.num_centroids:
        raise AssistantMismatch("num_centroids", f"{assistant_name}'s {assistant_config.num_centroids} centroids do not "
                                                 f"divide its vocabulary of {a.vocab_size}")
    return SharedKV(tuple((layer_type, stores[layer_type]) for layer_type in used), window)
