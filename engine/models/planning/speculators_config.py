"""Drafters made for one target (EAGLE-3, DFlash): reading their config.json and checking that a
checkpoint belongs to the target, without torch (the picker reads these on the GUI thread).

Two layouts are read:
- **Speculators** (vLLM's format; RedHatAI/*-speculator.eagle3 and the drafters ``tandem
  distill`` saves): ``speculators_model_type`` ("eagle3" or "dflash"), ``speculators_config``
  with ``algorithm``, ``proposal_methods`` and ``verifier``, the draft layers' own config under
  ``transformer_layer_config``, and ``draft_vocab_size``, ``target_hidden_size``,
  ``norm_before_residual``, ``eagle_aux_hidden_state_layer_ids`` (EAGLE-3) or ``block_size``,
  ``aux_hidden_state_layer_ids``, ``mask_token_id`` (DFlash).
- **The EAGLE authors' own** (``LlamaForCausalLMEagle3``; AngelSlim and SGLang checkpoints): a
  flat Llama config with ``draft_vocab_size``, the layer ids optionally under ``eagle_config``.
  z-lab's DFlash checkpoints are flat too (``DFlashDraftModel``, ``dflash_config``).

An EAGLE-3 layer reads the target's hidden states at three of its layers; the layer ids count
as vLLM counts them: id i is the input of the target's decoder layer i (the output of layer
i - 1). A checkpoint without ids uses EAGLE-3's default, [2, L // 2, L - 3].
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Algorithm = Literal["eagle3", "dflash"]
Layout = Literal["speculators", "eagle-authors", "dflash-authors"]

ALGORITHM_NAMES = {"eagle3": "EAGLE-3", "dflash": "DFlash"}


class SpeculatorError(ValueError):
    """A drafter checkpoint we cannot read, or one made for another model; the message is the
    user's."""


@dataclass(frozen=True)
class DraftLayers:
    """The draft layers' shape (a Llama / Qwen3 decoder layer's config)."""

    model_type: str
    hidden_size: int
    num_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_positions: int
    #: The target's vocabulary (the embedding's rows and the ids drafts are mapped to).
    vocab_size: int
    attention_bias: bool
    sliding_window: int | None
    #: Qwen3-style layers normalise each head's queries and keys.
    qk_norm: bool


@dataclass(frozen=True)
class SpeculatorSpec:
    algorithm: Algorithm
    layout: Layout
    layers: DraftLayers
    #: Rows of the drafter's own head (a reduced vocabulary mapped to the target's with d2t).
    draft_vocab_size: int
    #: The target's hidden size the auxiliary states have.
    target_hidden_size: int
    #: Target layer ids whose hidden states the drafter reads; None: the algorithm's default.
    aux_layer_ids: tuple[int, ...] | None
    norm_before_residual: bool
    norm_before_fc: bool
    verifier_name: str | None
    verifier_architectures: tuple[str, ...]
    #: Tokens a proposal drafts by default (``proposal_methods``; DFlash: its block less one).
    speculative_tokens: int | None
    block_size: int | None = None
    mask_token_id: int | None = None

    @property
    def label(self) -> str:
        return ALGORITHM_NAMES[self.algorithm]

    def aux_layers_for(self, target_layers: int) -> tuple[int, ...]:
        """The target layer ids this drafter reads on a target of ``target_layers`` layers."""
        if self.aux_layer_ids is not None:
            return self.aux_layer_ids
        if self.algorithm == "dflash":
            return default_dflash_layers(target_layers, self.layers.num_layers)
        return default_aux_layers(target_layers)


def default_aux_layers(target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers: [2, L // 2, L - 3]."""
    return (2, target_layers // 2, target_layers - 3)


def default_dflash_layers(target_layers: int, draft_layers: int) -> tuple[int, ...]:
    """DFlash's default: one target layer per draft layer, spread evenly over 1 .. L - 3."""
    if draft_layers == 1:
        return (target_layers // 2,)
    span = target_layers - 4
    return tuple(int(round(1 + i * span / (draft_layers - 1))) for i in range(draft_layers))


def is_speculator_config(config: dict | None) -> bool:
    """Whether a config.json is a drafter made for a target (EAGLE-3 / DFlash, either layout)."""
    if not isinstance(config, dict):
        return False
    if "speculators_model_type" in config:
        return True
    architectures = config.get("architectures") or []
    return any(a in _AUTHOR_ARCHITECTURES for a in architectures)


_AUTHOR_ARCHITECTURES = {"LlamaForCausalLMEagle3": "eagle3", "Eagle3Speculator": "eagle3", "DFlashDraftModel": "dflash"}


def read_speculator(folder: Path) -> SpeculatorSpec:
    """The spec of the drafter checkpoint in ``folder`` (SpeculatorError when it is not one we run)."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpeculatorError(f"{Path(folder).name}: cannot read its config.json ({exc})") from exc
    return parse_speculator(config, Path(folder).name)


def parse_speculator(config: dict, name: str = "the drafter") -> SpeculatorSpec:
    if not is_speculator_config(config):
        raise SpeculatorError(f"{name} is not an EAGLE-3 or DFlash drafter (no speculators_model_type and no such architecture)")
    try:
        if "speculators_model_type" in config:
            return _parse_speculators(config, name)
        return _parse_authors(config, name)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, SpeculatorError):
            raise
        raise SpeculatorError(f"{name}: its config.json lacks or garbles a field the drafter needs ({exc!r})") from exc


def _parse_speculators(config: dict, name: str) -> SpeculatorSpec:
    algorithm = config["speculators_model_type"]
    if algorithm not in ALGORITHM_NAMES:
        raise SpeculatorError(f"{name} is a {algorithm!r} speculator; Tandem runs EAGLE-3 and DFlash ones")
    spec_config = config.get("speculators_config") or {}
    if spec_config.get("algorithm", algorithm) != algorithm:
        raise SpeculatorError(f"{name}: speculators_config says {spec_config.get('algorithm')!r} "
                              f"but the model type is {algorithm!r}")
    layers = _draft_layers(config["transformer_layer_config"])
    verifier = spec_config.get("verifier") or {}
    methods = spec_config.get("proposal_methods") or []
    tokens = next((int(m["speculative_tokens"]) for m in methods if isinstance(m, dict) and "speculative_tokens" in m), None)
    ids_key = "eagle_aux_hidden_state_layer_ids" if algorithm == "eagle3" else "aux_hidden_state_layer_ids"
    block = int(config["block_size"]) if algorithm == "dflash" and config.get("block_size") else None
    return SpeculatorSpec(
        algorithm=algorithm,
        layout="speculators",
        layers=layers,
        draft_vocab_size=int(config.get("draft_vocab_size") or layers.vocab_size),
        target_hidden_size=int(config.get("target_hidden_size") or layers.hidden_size),
        aux_layer_ids=_ids(config.get(ids_key)),
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        norm_before_fc=bool(config.get("norm_before_fc", False)),
        verifier_name=verifier.get("name_or_path"),
        verifier_architectures=tuple(verifier.get("architectures") or ()),
        speculative_tokens=tokens if tokens is not None else (block - 1 if block else None),
        block_size=block,
        mask_token_id=config.get("mask_token_id"),
    )


def _parse_authors(config: dict, name: str) -> SpeculatorSpec:
    algorithm = next(_AUTHOR_ARCHITECTURES[a] for a in config["architectures"] if a in _AUTHOR_ARCHITECTURES)
    layers = _draft_layers(config)
    if algorithm == "dflash":
        dflash = config.get("dflash_config") or {}
        block = int(config.get("block_size") or dflash.get("block_size") or 16)
        return SpeculatorSpec(
            algorithm="dflash", layout="dflash-authors", layers=layers,
            draft_vocab_size=int(config.get("draft_vocab_size") or layers.vocab_size),
            target_hidden_size=int(config.get("target_hidden_size") or layers.hidden_size),
            aux_layer_ids=_ids(dflash.get("target_layer_ids")), norm_before_residual=False, norm_before_fc=False,
            verifier_name=config.get("_name_or_path") or None, verifier_architectures=(),
            speculative_tokens=block - 1, block_size=block,
            mask_token_id=dflash.get("mask_token_id", config.get("mask_token_id")),
        )
    eagle = config.get("eagle_config") or {}
    return SpeculatorSpec(
        algorithm="eagle3", layout="eagle-authors", layers=layers,
        draft_vocab_size=int(config.get("draft_vocab_size") or layers.vocab_size),
        target_hidden_size=int(config.get("target_hidden_size") or layers.hidden_size),
        aux_layer_ids=_ids(eagle.get("eagle_aux_hidden_state_layer_ids") or config.get("eagle_aux_hidden_state_layer_ids")),
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        norm_before_fc=bool(config.get("norm_before_fc", False)),
        # The authors' configs do not name their verifier; only the shapes can be checked.
        verifier_name=None, verifier_architectures=(), speculative_tokens=None,
    )


def _draft_layers(c: dict) -> DraftLayers:
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    rope = c.get("rope_parameters") or {}
    scaling = c.get("rope_scaling")
    if not scaling and rope.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    window = c.get("sliding_window") if c.get("use_sliding_window", "sliding_attention" in (c.get("layer_types") or [])) else None
    return DraftLayers(
        model_type=str(c.get("model_type", "llama")),
        hidden_size=hidden,
        num_layers=int(c.get("num_hidden_layers", 1)),
        heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads),
        intermediate_size=int(c["intermediate_size"]),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
        rope_scaling=scaling or None,
        max_positions=int(c.get("max_position_embeddings", 4096)),
        vocab_size=int(c["vocab_size"]),
        attention_bias=bool(c.get("attention_bias", False)),
        sliding_window=int(window) if window else None,
        qk_norm=str(c.get("model_type", "llama")).startswith("qwen3"),
    )


def _ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    ids = tuple(int(i) for i in value)
    if not ids:
        return None
    return ids


# -- does it belong to the target? -------------------------------------------------------------

_NOISE = re.compile(r"(-|_|\.)(gguf|q\d.*|f16|bf16|fp16|awq|gptq|fp8|int[48].*)$")


def model_family_name(name: str | None) -> str | None:
    """A model's name as a verifier check compares it: the repo's last part, lower case, without
    a file format or quantization suffix ("Qwen/Qwen3-8B" and "qwen3-8b-q4_k_m.gguf" agree)."""
    if not name:
        return None
    last = str(name).rstrip("/").split("/")[-1].lower()
    if last.endswith(".gguf"):
        last = last[: -len(".gguf")]
    previous = None
    while previous != last:
        previous, last = last, _NOISE.sub("", last)
    return last or None


def check_belongs_to(spec: SpeculatorSpec, target_config: dict, target_name: str, drafter_name: str,
                     target_names: tuple[str, ...] = ()) -> tuple[int, ...]:
    """Refuse (SpeculatorError) a drafter made for another model: its verifier's name (where the
    checkpoint says it and the target's names are known), the hidden size its layers read, the
    vocabulary its drafts are ids of, and layer ids the target has. Returns the target layer ids
    it reads."""
    text = target_config.get("text_config") or target_config
    hidden = int(text["hidden_size"])
    vocab = int(text["vocab_size"])
    layers = int(text["num_hidden_layers"])
    label = spec.label
    if spec.target_hidden_size != hidden:
        raise SpeculatorError(
            f"{drafter_name} is an {label} drafter for a model with hidden size {spec.target_hidden_size}; "
            f"{target_name} has {hidden}, so it was made for another model")
    if spec.layers.vocab_size != vocab:
        raise SpeculatorError(
            f"{drafter_name} drafts ids of a {spec.layers.vocab_size:,}-token vocabulary; {target_name}'s has {vocab:,}")
    wanted = model_family_name(spec.verifier_name)
    known = {n for n in (model_family_name(t) for t in target_names) if n}
    if wanted and known and wanted not in known:
        raise SpeculatorError(
            f"{drafter_name} was made for {spec.verifier_name}, not {target_name}: its drafts would be accepted "
            "rarely, so Tandem does not pair them")
    ids = spec.aux_layers_for(layers)
    if spec.algorithm == "eagle3" and len(ids) != 3:
        raise SpeculatorError(f"{drafter_name}: an EAGLE-3 drafter reads three target layers, its config names {list(ids)}")
    # EAGLE-3's id L is the last layer's output (before the final norm), as vLLM counts; DFlash's
    # ids count layer outputs, so they stop at L - 1.
    top = layers if spec.algorithm == "eagle3" else layers - 1
    bad = [i for i in ids if not 0 <= i <= top]
    if bad:
        raise SpeculatorError(f"{drafter_name} reads target layers {list(ids)}; {target_name} has layers 0-{layers - 1}")
    return ids
