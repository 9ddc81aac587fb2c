"""What memory depends on in a model's architecture, and reading it from a config.json.

``Architecture`` counts only the layers that store K/V, grouped by shape: full-attention layers
(K/V for every token) and sliding-window layers (at most their window); layers that reuse
another layer's K/V store none. ``architecture_from_config`` reads a transformers config.json:
fields it lacks come from a fallback (the catalog's), and an architecture we don't know is
estimated conservatively (every layer keeps full-length K/V) and flagged, never guessed silently.

No torch here: the app reads these on the GUI thread.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# model_types whose configs we know how to read: anything else is estimated conservatively.
KNOWN_MODEL_TYPES = {
    "llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "phi3", "gemma", "gemma2",
    "gemma3", "gemma3_text", "gemma4", "gemma4_text", "gemma4_assistant", "glm4_moe", "deepseek_v3",
}


class ConfigError(ValueError):
    """A model config.json that does not say enough to estimate memory at all."""


@dataclass(frozen=True)
class AttentionGroup:
    """Layers that store K/V of one shape. window None: full attention (K/V for every token)."""

    layers: int
    kv_heads: int
    head_dim: int
    window: int | None = None

    def kv_bytes(self, context: int, dtype_bytes: float) -> int:
        tokens = context if self.window is None else min(context, self.window)
        return int(2 * self.layers * self.kv_heads * self.head_dim * tokens * dtype_bytes)


@dataclass(frozen=True)
class Architecture:
    """Facts about one model that memory depends on. ``full`` and ``sliding`` count only layers
    that store K/V; ``kv_shared_layers`` reuse another layer's and store none."""

    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    full: AttentionGroup
    sliding: AttentionGroup | None = None
    intermediate_size: int | None = None
    attention_heads: int | None = None
    max_context: int | None = None
    kv_shared_layers: int = 0
    tie_word_embeddings: bool = True
    source: str = "catalog"  # "catalog", "config.json", or a path
    conservative: bool = False
    notes: tuple[str, ...] = ()

    @property
    def full_attention_layers(self) -> int:
        return self.full.layers

    @property
    def sliding_window_layers(self) -> int:
        return self.sliding.layers if self.sliding else 0

    @property
    def sliding_window(self) -> int | None:
        return self.sliding.window if self.sliding else None

    @property
    def kv_heads(self) -> int:
        return self.full.kv_heads

    @property
    def head_dim(self) -> int:
        return self.full.head_dim

    def kv_bytes(self, context: int, dtype_bytes: float) -> int:
        """K/V cache for ``context`` tokens: 2 (K and V) x layers x kv_heads x head_dim x bytes per
        token, sliding-window layers holding at most their window."""
        groups = [self.full] + ([self.sliding] if self.sliding else [])
        return sum(g.kv_bytes(context, dtype_bytes) for g in groups)

    def prefill_kv_bytes(self, tokens: int, dtype_bytes: float) -> int:
        """K/V held right after feeding ``tokens`` tokens in one pass: transformers' sliding-window
        cache keeps a view into that pass's whole K/V until the next step, so for that moment
        sliding layers hold every token too."""
        unbounded = [replace(g, window=None) for g in (self.full, self.sliding) if g]
        return sum(g.kv_bytes(tokens, dtype_bytes) for g in unbounded)


def _text_config(config: dict) -> dict:
    """Multimodal checkpoints (Gemma 3/4) keep the language model's numbers in text_config."""
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(text)
        return merged
    return config


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def architecture_from_config(config: dict, fallback: Architecture | None = None, source: str = "config.json") -> Architecture:
    """Architecture facts from a transformers config.json. Fields it lacks come from
    ``fallback`` (the catalog's), noted; without a fallback, a model type we don't know or
    missing attention fields give a conservative estimate (every layer full attention, K/V
    heads = attention heads), flagged; missing sizes raise ConfigError."""
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: a config must be a JSON object, not {type(config).__name__}")
    cfg = _text_config(config)
    notes: list[str] = []
    conservative = False
    model_type = str(cfg.get("model_type") or config.get("model_type") or "unknown")

    def size(*keys: str, fallback_value: int | None = None) -> int | None:
        for key in keys:
            value = _int(cfg.get(key))
            if value:
                return value
        if fallback_value is not None:
            notes.append(f"{source} lacks {keys[0]}; catalog value {fallback_value} used")
        return fallback_value

    fb = fallback
    layers = size("num_hidden_layers", "n_layer", "num_layers", fallback_value=fb and fb.num_layers)
    hidden = size("hidden_size", "n_embd", "d_model", fallback_value=fb and fb.hidden_size)
    vocab = size("vocab_size", "padded_vocab_size", fallback_value=fb and fb.vocab_size)
    missing = [k for k, v in (("num_hidden_layers", layers), ("hidden_size", hidden), ("vocab_size", vocab)) if not v]
    if missing:
        raise ConfigError(f"{source} ({model_type}) lacks {', '.join(missing)}: cannot estimate its memory")
    heads = size("num_attention_heads", "n_head", "num_heads")
    kv_heads = size("num_key_value_heads", "num_kv_heads", "n_head_kv")
    if kv_heads is None and cfg.get("multi_query"):
        kv_heads = 1
    if kv_heads is None:
        if fb:
            kv_heads = fb.full.kv_heads if fb.sliding is None else fb.sliding.kv_heads
            notes.append(f"{source} lacks num_key_value_heads; catalog value {kv_heads} used")
        elif heads:
            # transformers' own default: no separate K/V head count means one K/V head per query head.
            kv_heads = heads
            if model_type not in KNOWN_MODEL_TYPES:
                conservative = True
        else:
            raise ConfigError(f"{source} ({model_type}) lacks num_attention_heads and num_key_value_heads")
    head_dim = size("head_dim")
    if head_dim is None:
        if fb:
            head_dim = fb.sliding.head_dim if fb.sliding else fb.full.head_dim
            notes.append(f"{source} lacks head_dim; catalog value {head_dim} used")
        elif heads:
            head_dim = hidden // heads  # transformers' default for every model that has no head_dim
        else:
            raise ConfigError(f"{source} ({model_type}) lacks num_attention_heads and head_dim")

    if model_type not in KNOWN_MODEL_TYPES and not fb:
        conservative = True
        notes.append(f"unknown architecture {model_type!r}: estimated as if every layer kept full-length K/V")

    # Which layers store K/V, and of what shape.
    layer_types = cfg.get("layer_types")
    if not (isinstance(layer_types, list) and len(layer_types) == layers and all(isinstance(t, str) for t in layer_types)):
        if layer_types is not None:
            notes.append(f"{source}: layer_types unreadable; all layers taken as full attention")
        layer_types = ["full_attention"] * layers
    window = _int(cfg.get("sliding_window")) or _int(cfg.get("attention_chunk_size"))
    if conservative or not window:
        layer_types = ["full_attention"] * layers  # without a window a layer keeps every token
    shared = _int(cfg.get("num_kv_shared_layers")) or 0
    if "gemma4_assistant" in (model_type, config.get("model_type")):
        shared = layers  # it reads the target's K/V in every layer (transformers enforces this)
    shared = 0 if conservative else min(shared, layers)
    storing = layer_types[: layers - shared]

    # K/V shape per storing layer. Gemma 4 full-attention layers have their own head size and,
    # with attention_k_eq_v, their own K/V head count: configs saved by transformers list them
    # per layer (per_layer_config), published ones as global_head_dim / num_global_key_value_heads.
    per_layer = cfg.get("per_layer_config") if isinstance(cfg.get("per_layer_config"), dict) else {}
    full_kv, full_dim = kv_heads, head_dim
    if model_type.startswith("gemma4") and not per_layer:
        full_dim = _int(cfg.get("global_head_dim")) or 512
        if cfg.get("attention_k_eq_v", True) and _int(cfg.get("num_global_key_value_heads")):
            full_kv = cfg["num_global_key_value_heads"]
    shapes: dict[str, list[tuple[int, int]]] = {"full": [], "sliding": []}
    for i, kind in enumerate(storing):
        group = "sliding" if kind in ("sliding_attention", "chunked_attention") else "full"
        override = per_layer.get(str(i)) or per_layer.get(i) or {}
        default = (full_kv, full_dim) if group == "full" else (kv_heads, head_dim)
        shapes[group].append((_int(override.get("num_key_value_heads")) or default[0], _int(override.get("head_dim")) or default[1]))
    # In-checkpoint MTP layers (GLM-4.5, DeepSeek-V3) keep K/V of their own when drafting.
    shapes["full"] += [(kv_heads, head_dim)] * (_int(cfg.get("num_nextn_predict_layers")) or 0)

    def group_of(name: str, window: int | None = None) -> AttentionGroup | None:
        found = shapes[name]
        if not found:
            return None
        if len(set(found)) > 1:
            notes.append(f"{source}: {name}-attention layers differ in K/V shape; the largest is assumed for all")
        kv, dim = max(found, key=lambda s: s[0] * s[1])
        return AttentionGroup(len(found), kv, dim, window)

    full = group_of("full") or AttentionGroup(0, full_kv, full_dim)
    sliding = group_of("sliding", window)
    if sliding is None and fb is not None and fb.sliding is not None and not conservative:
        notes.append(f"{source} does not say which layers use a sliding window; all taken as full attention")
    return Architecture(
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        vocab_size=vocab,
        full=full,
        sliding=sliding,
        intermediate_size=_int(cfg.get("intermediate_size")) or (fb.intermediate_size if fb else None),
        attention_heads=heads or (fb.attention_heads if fb else None),
        max_context=_int(cfg.get("max_position_embeddings")) or (fb.max_context if fb else None),
        kv_shared_layers=shared,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", fb.tie_word_embeddings if fb else True)),
        source=source,
        conservative=conservative,
        notes=tuple(notes),
    )


def estimate_params(arch: Architecture, config: dict | None = None) -> int:
    """Parameter count of a dense decoder from its shape (plus experts when the config has them),
    for a model we have neither in the catalog nor as safetensors. An estimate, said so by callers."""
    cfg = _text_config(config or {})
    h, v, n = arch.hidden_size, arch.vocab_size, arch.num_layers
    heads = arch.attention_heads or max(1, h // max(arch.head_dim, 1))
    q = heads * arch.head_dim
    kv = arch.kv_heads * arch.head_dim
    inter = arch.intermediate_size or 4 * h
    experts = _int(cfg.get("num_experts")) or _int(cfg.get("n_routed_experts")) or _int(cfg.get("num_local_experts")) or 0
    moe_inter = _int(cfg.get("moe_intermediate_size")) or inter
    mlp = 3 * h * (experts * moe_inter if experts else inter)
    per_layer = 2 * h * q + 2 * h * kv + mlp + 2 * h
    embeddings = v * h * (1 if arch.tie_word_embeddings else 2)
    return embeddings + n * per_layer + h


# Llama-shaped decoders whose every layer attends to the whole causal context.
PLAIN_CAUSAL_ARCHITECTURES = frozenset({"qwen2", "llama", "mistral"})


def plain_causal_reason(config) -> str | None:
    """None when a transformers config (the object) describes a Llama-shaped decoder with full
    causal attention in every layer, which our CPU kernels assume; otherwise why not."""
    if config.model_type not in PLAIN_CAUSAL_ARCHITECTURES:
        return f"architecture {config.model_type!r}"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    return None
