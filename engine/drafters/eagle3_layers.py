"""An EAGLE-3 drafter's layers as a torch module, read from its checkpoint (either layout that
engine.models.planning.speculators_config reads).

One entry per target position j: the target's hidden states at three of its layers (a [3H] row)
and the token after j, x_{j+1}. The first layer reads both:

    g      = fc(aux_j)                                         [H]   (chained steps: g given)
    x      = cat(input_norm(E[x_{j+1}]), hidden_norm(g))       [2H]  q/k/v read 2H
    r      = g (or hidden_norm(g) with norm_before_residual)
    r      = r + o(attention(x, position j))                   own causal KV cache
    r      = r + mlp(post_attention_norm(r))
    logits = lm_head(norm(r))                                  [draft vocabulary]
    next g = r                                                 (before the final norm)

Further layers (rare) are plain decoder layers on r. Draft index d is target token d + d2t[d].
Written here rather than through transformers: no transformers class has the 2H-input first
layer, and the drafter needs its own KV cache with exact rollback.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.models.planning.speculators_config import SpeculatorError, SpeculatorSpec


class RmsNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


#: Entries a row attends back at most, where the checkpoint sets no window of its own. The
#: target's states already carry what came before, while the layer's cost grows with every
#: entry it reads (a 4k-token prompt's first proposal took 5.4 s: docs/benchmarks/log.md).
#: Tandem's distillation trains on sequences of up to ~1,024 entries (768 of context and a
#: reply), so a drafter distilled here never attends farther than it learnt to.
READ_WINDOW = 1024


class DraftKV:
    """Keys and values of one draft layer [kv_heads, capacity, D], grown by doubling."""

    def __init__(self, kv_heads: int, head_dim: int) -> None:
        self.k = torch.empty(kv_heads, 64, head_dim)
        self.v = torch.empty_like(self.k)
        #: Entries before this position were never written (past every row's window: skipped).
        self.first = 0

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[1]
        if end > self.k.shape[1]:
            capacity = max(end, 2 * self.k.shape[1])
            kept = min(start, self.k.shape[1])  # a first write past the skipped entries starts beyond it
            for name in ("k", "v"):
                old = getattr(self, name)
                new = torch.empty(old.shape[0], capacity, old.shape[2])
                new[:, self.first : kept] = old[:, self.first : kept]
                setattr(self, name, new)
        self.k[:, start:end] = k
        self.v[:, start:end] = v


class Attention(torch.nn.Module):
    def __init__(self, spec: SpeculatorSpec, width: int, qk_norm: bool, bias: bool) -> None:
        super().__init__()
        c = spec.layers
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.head_dim
        self.window = c.sliding_window or READ_WINDOW
        self.q_proj = torch.nn.Linear(width, c.heads * c.head_dim, bias=bias)
        self.k_proj = torch.nn.Linear(width, c.kv_heads * c.head_dim, bias=bias)
        self.v_proj = torch.nn.Linear(width, c.kv_heads * c.head_dim, bias=bias)
        self.o_proj = torch.nn.Linear(c.heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RmsNorm(c.head_dim, c.rms_norm_eps) if qk_norm else None
        self.k_norm = RmsNorm(c.head_dim, c.rms_norm_eps) if qk_norm else None

    def forward(self, x: torch.Tensor, cache: DraftKV, start: int, cos: torch.Tensor, sin: torch.Tensor,
                keep: int | None = None) -> torch.Tensor:
        """x [n, width] at positions start .. start + n - 1, after ``start`` cached ones: every row's
        key and value cached, the output of the last ``keep`` rows (all by default) returned."""
        n = x.shape[0]
        keep = n if keep is None else keep
        k = self.k_proj(x).view(n, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        q = self.q_proj(x[n - keep :]).view(keep, self.heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _rotate(q, cos[n - keep :], sin[n - keep :]), _rotate(k, cos, sin)
        cache.write(start, k.transpose(0, 1), v.transpose(0, 1))
        end = start + n
        start = end - keep  # the rows whose output is asked for
        n = keep
        lo = max(cache.first, start - self.window + 1)  # the first entry any of these rows sees
        rows = torch.arange(start, end)[:, None]
        cols = torch.arange(lo, end)[None, :]
        allowed = (cols <= rows) & (cols > rows - self.window)
        # enable_gqa: each KV head serves its group of query heads without copying the cache.
        out = F.scaled_dot_product_attention(q.transpose(0, 1), cache.k[:, lo:end], cache.v[:, lo:end], attn_mask=allowed,
                                             enable_gqa=True)  # [heads, n, D]
        return self.o_proj(out.transpose(0, 1).reshape(n, self.heads * self.head_dim))


class Mlp(torch.nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.down_proj = torch.nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(torch.nn.Module):
    """Module names as the checkpoints name them (layers.N.self_attn.q_proj, ...)."""

    def __init__(self, spec: SpeculatorSpec, first: bool, qk_norm: bool, bias: bool) -> None:
        super().__init__()
        c = spec.layers
        self.first = first
        self.self_attn = Attention(spec, 2 * c.hidden_size if first else c.hidden_size, qk_norm, bias)
        self.mlp = Mlp(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RmsNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RmsNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RmsNorm(c.hidden_size, c.rms_norm_eps) if first else None
        self.norm_before_residual = spec.norm_before_residual

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, embeds: torch.Tensor,
                cache: DraftKV, start: int, cos: torch.Tensor, sin: torch.Tensor,
                keep: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (mlp output, residual) as vLLM's layers do: their sum is the layer's output; of
        the last ``keep`` rows only (every row's key and value are cached all the same)."""
        if self.first:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        else:
            residual = hidden + residual
            x = self.input_layernorm(residual)
        keep = x.shape[0] if keep is None else keep
        residual = residual[x.shape[0] - keep :] + self.self_attn(x, cache, start, cos, sin, keep)
        return self.mlp(self.post_attention_layernorm(residual)), residual


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * cos + rotated * sin


class Eagle3Layers(torch.nn.Module):
    """The drafter's modules; ``step`` runs entries through them with a cache per layer."""

    def __init__(self, spec: SpeculatorSpec, qk_norm: bool, bias: bool, own_embedding: bool, fc_norm: bool) -> None:
        super().__init__()
        c = spec.layers
        self.spec = spec
        self.fc = torch.nn.Linear(3 * spec.target_hidden_size, c.hidden_size, bias=False)
        self.fc_norm = RmsNorm(3 * spec.target_hidden_size, c.rms_norm_eps) if fc_norm else None
        self.layers = torch.nn.ModuleList(DraftLayer(spec, i == 0, qk_norm, bias) for i in range(c.num_layers))
        self.norm = RmsNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = torch.nn.Linear(c.hidden_size, spec.draft_vocab_size, bias=False)
        self.embed_tokens = torch.nn.Embedding(c.vocab_size, c.hidden_size) if own_embedding else None
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        self.inv_freq, self.rope_scale = _rope(spec)

    def new_caches(self) -> list[DraftKV]:
        c = self.spec.layers
        return [DraftKV(c.kv_heads, c.head_dim) for _ in self.layers]

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's three layers' states [n, 3H] to the drafter's width [n, H]."""
        if self.fc_norm is not None:
            aux = self.fc_norm(aux)
        return self.fc(aux)

    def step(self, hidden: torch.Tensor, embeds: torch.Tensor, caches: list[DraftKV],
             start: int, outputs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Entries (hidden [n, H], embeds [n, H]) at positions start ..: returns (draft-vocabulary
        logits, the next step's hidden [., H]) of the last ``outputs`` entries (all by default).
        A catch-up over many entries asks for its last one: the others only fill the caches,
        which in the last layer needs their keys and values alone (the head over the draft
        vocabulary, ~half a row's cost, and the attention and MLP are skipped for them)."""
        n = hidden.shape[0]
        outputs = n if outputs is None else outputs
        freqs = torch.arange(start, start + n, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        cos = (angles.cos() * self.rope_scale)[:, None, :]
        sin = (angles.sin() * self.rope_scale)[:, None, :]
        residual = None
        last = len(self.layers) - 1
        for i, (layer, cache) in enumerate(zip(self.layers, caches)):  # a later layer reads every row's output
            hidden, residual = layer(hidden, residual, embeds, cache, start, cos, sin, outputs if i == last else None)
        out = hidden + residual
        return self.lm_head(self.norm(out)), out

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def _rope(spec: SpeculatorSpec) -> tuple[torch.Tensor, float]:
    """inv_freq and the attention scale as transformers computes them for the layer's config
    (Llama 3's and YaRN's scalings included)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    c = spec.layers
    config = LlamaConfig(hidden_size=c.hidden_size, num_attention_heads=c.heads, num_key_value_heads=c.kv_heads,
                         head_dim=c.head_dim, max_position_embeddings=c.max_positions,
                         rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta, **(c.rope_scaling or {})})
    kind = config.rope_parameters.get("rope_type", "default")
    if kind == "default":
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        return inv_freq, 1.0
    if kind not in ROPE_INIT_FUNCTIONS:
        raise SpeculatorError(f"the drafter's rotary embedding {kind!r} is not one Tandem knows")
    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    return inv_freq.float(), float(scale)


# -- reading a checkpoint ------------------------------------------------------------------------

def _checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    if files:
        for file in files:
            tensors.update(load_file(str(file)))
    elif (Path(folder) / "pytorch_model.bin").is_file():
        tensors = torch.load(Path(folder) / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise SpeculatorError(f"{Path(folder).name} holds no weights (no .safetensors or pytorch_model.bin)")
    out = {}
    for key, value in tensors.items():
        key = key.removeprefix("model.")
        key = key.replace("midlayer.", "layers.0.")  # the EAGLE authors' name for the one layer
        out[key] = value
    return out


def fill_from_checkpoint(module: torch.nn.Module, tensors: dict[str, torch.Tensor], name: str, identity_d2t: bool,
                         sources: dict[str, str] | None = None) -> None:
    """Load every tensor of ``module`` from the checkpoint's (fp32; d2t as ids), by the same
    name or the one ``sources`` gives; SpeculatorError naming a missing or misshapen tensor. A
    missing d2t is the identity where ``identity_d2t`` (the head covers the whole vocabulary)."""
    state = {}
    for key, holder in module.state_dict().items():
        source = (sources or {}).get(key, key)
        if source not in tensors:
            if key == "d2t" and identity_d2t:
                state[key] = torch.zeros_like(holder)
                continue
            raise SpeculatorError(f"{name}: its weights lack {source}")
        value = tensors[source]
        if tuple(value.shape) != tuple(holder.shape):
            raise SpeculatorError(f"{name}: {source} is {tuple(value.shape)}, its config implies {tuple(holder.shape)}")
        state[key] = value.long() if key == "d2t" else value.float()
    module.load_state_dict(state)


def load_eagle3_layers(folder: Path, spec: SpeculatorSpec) -> Eagle3Layers:
    """The drafter's layers with the checkpoint's weights, in fp32 (SpeculatorError naming a
    missing or misshapen tensor). The EAGLE authors' ``midlayer`` is layer 0; the embedding is
    the drafter's own where it ships one, else the target's (``embed`` of the drafter)."""
    name = Path(folder).name
    c = spec.layers
    if c.head_dim % 2 or c.heads % c.kv_heads or not math.isfinite(c.rope_theta):
        raise SpeculatorError(f"{name}: its attention shape is not one Tandem runs (odd head size or uneven head groups)")
    tensors = _checkpoint_tensors(folder)
    model = Eagle3Layers(spec, qk_norm="layers.0.self_attn.q_norm.weight" in tensors,
                         bias="layers.0.self_attn.q_proj.bias" in tensors,
                         own_embedding="embed_tokens.weight" in tensors, fc_norm=spec.norm_before_fc)
    fill_from_checkpoint(model, tensors, name, identity_d2t=spec.draft_vocab_size == c.vocab_size,
                         sources={"fc_norm.weight": "input_norm.weight"})
    stored = tensors.get("embed_tokens.weight")
    if model.embed_tokens is not None and stored is not None and stored.dtype in (torch.bfloat16, torch.float16):
        # The shipped embedding (a copy of the target's, most often as large as all the layers
        # together) stays at its stored 16 bits: a step reads its rows through .float(), which
        # gives the same values as an fp32 copy, at half the memory.
        model.embed_tokens.to(stored.dtype)
    targets = model.target_ids(torch.arange(spec.draft_vocab_size))
    if int(targets.min()) < 0 or int(targets.max()) >= c.vocab_size:
        raise SpeculatorError(f"{name}: its d2t maps draft ids outside the target's vocabulary of {c.vocab_size:,}")
    return model.eval()
