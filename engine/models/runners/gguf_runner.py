"""Decode a GGUF model (engine.gguf) without transformers' per-layer machinery.

Why: on a GGUF target the quantized linears are one kernel call each, and what surrounds them in
transformers' modules (cache objects, masks, position plumbing, ~50 small ops per layer) cost
~16% of a one-token step on the default target. This runner does the same arithmetic over the
model's own modules and tensors (no copy of any weight), with its own key/value cache
(engine.models.runners.own_cache_runner), in seven kernel calls a layer plus SiLU's two ops: the rotary
embedding, the cache's new rows and attention in one (attention.rotary_attention), each residual
add with the RMSNorm after it in one (norm.add_rms_norm); both keep PyTorch's roundings, so the
bits stay transformers'.

The cache holds keys and values in fp16 (KV_DTYPE), as llama.cpp does by default: half the
memory of fp32 at long context, and attention, which reads the whole cache for every row, reads
half the bytes. Every row is rounded the same way whichever pass wrote it, so this changes no
invariance below; what it costs in fidelity `tandem fidelity` measures (candidate file-kv32). Same interface as ModelRunner (reset, forward_hidden,
forward, crop, length) for the targets it supports: Llama / Qwen2 / Qwen3-shaped GGUF models
with plain rotary embeddings, a SwiGLU MLP and no sliding window.

Every row is computed independently of how many rows share the pass (the GGUF kernels and the
attention kernel are batch-invariant, the rest is per-row arithmetic), prompt rows included, so
verifying k+1 drafted tokens gives the bits that decoding them one at a time gives (speculation
on it stays token-identical to its plain decoding), a prompt prefilled in chunks gives the bits
of one pass, and a prefix kept from an earlier request (engine.models.runners.prefix_reuse) the bits a
fresh prefill computes.
"""
from __future__ import annotations

import logging

import torch
from torch.nn import functional as F

from engine.gguf.modules import DenseLinear, GgufLinear
from engine.models.runners.own_cache_runner import OwnCacheRunner
from kernels import attention, gguf_linear, norm
from kernels.attention.reference import rotate as _rotate
from kernels.norm.reference import rms_norm as _rms_norm

log = logging.getLogger(__name__)

_LINEARS = (GgufLinear, DenseLinear)
# Qwen3 too, which transformers' path cannot give the batch-invariant attention (its per-head
# norms are outside engine.models.planning.architecture's plain causal shape): here it decodes invariantly.
ARCHITECTURES = ("llama", "qwen2", "qwen3")


def unsupported_reason(model) -> str | None:
    """None when GgufRunner can run ``model``, else why not."""
    config = model.config
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        return f"architecture {getattr(config, 'model_type', None)!r}"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return "MLP is not a bias-free SwiGLU"
    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") != "default":
        return "rotary embedding type"
    if attention.fast_backend() is None:
        return "no compiled attention kernel here"
    try:
        for layer in model.get_decoder().layers:
            attn, mlp = layer.self_attn, layer.mlp
            parts = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            if not all(isinstance(p, _LINEARS) for p in parts):
                return "linear layers are not the GGUF file's"
    except AttributeError as exc:
        return f"layer layout ({exc})"
    return None


def worth_using(model) -> bool:
    reason = unsupported_reason(model)
    if reason:
        log.info("GGUF model runs through transformers' modules: %s", reason)
    return reason is None


class _Layer:
    """One decoder layer's modules and norm weights, read once (attribute lookups add up)."""

    def __init__(self, layer) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm = layer.input_layernorm.weight.float()
        self.post_norm = layer.post_attention_layernorm.weight.float()
        self.q, self.k, self.v, self.o = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        self.gate, self.up, self.down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        # Qwen3 normalizes each query and key head before the rotation.
        self.q_norm = attn.q_norm.weight.float() if hasattr(attn, "q_norm") else None
        self.k_norm = attn.k_norm.weight.float() if hasattr(attn, "k_norm") else None
        # q, k, v (and gate, up) read the same input: one kernel call each group where all are
        # the file's blocks in its own row order (same bits, fewer calls and thread wake-ups).
        self.qkv = _group(self.q, self.k, self.v)
        self.gate_up = _group(self.gate, self.up)


def _group(*modules) -> tuple[list, list] | None:
    """(weights, biases) for gguf_linear.linear_group, or None where a module is not a plain
    GgufLinear (a dense F16 / F32 matrix, or a llama file's Q / K with their rows reordered)."""
    if not all(isinstance(m, GgufLinear) and m.out_order is None for m in modules):
        return None
    return [m.weight_blocks for m in modules], [m.bias for m in modules]


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


#: The cache's element type (see the module docstring): fp16 for its 10 mantissa bits (bf16 keeps
#: 7); keys and values of these models stay far inside its range (largest finite 65,504).
KV_DTYPE = torch.float16


class GgufRunner(OwnCacheRunner):
    def __init__(self, model, initial_capacity: int = 256, kv_dtype: torch.dtype = KV_DTYPE) -> None:
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"GgufRunner cannot run this model: {reason}")
        super().__init__(model)
        decoder = model.get_decoder()
        self.embed = model.get_input_embeddings()
        self.head = model.get_output_embeddings()
        self.layers = [_Layer(layer) for layer in decoder.layers]
        attn = decoder.layers[0].self_attn
        self._allocate_cache(len(self.layers), int(getattr(attn, "head_dim", attn.q_proj.out_features // self.n_heads)),
                             initial_capacity, kv_dtype)
        self.scaling = float(getattr(attn, "scaling", self.head_dim ** -0.5))

    @torch.inference_mode()
    def forward_hidden(self, token_ids: list[int] | torch.Tensor, n_last: int = 1) -> torch.Tensor:
        """Feed ``token_ids`` after the cached ones; the final normed hidden states [n_last, H]."""
        n = len(token_ids)
        start, end = self._new_positions(n)
        ids = token_ids.to(torch.long).view(n) if isinstance(token_ids, torch.Tensor) else torch.tensor(token_ids)
        x = self.embed(ids).float()
        # cos / sin as transformers' rotary module makes them: the angles in fp32, doubled.
        freqs = torch.arange(start, end, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        cos = (angles.cos() * self.rope_scale)[:, None, :]
        sin = _signed_sin((angles.sin() * self.rope_scale)[:, None, :])
        cos_rows, sin_rows = cos.view(n, -1), sin.view(n, -1)  # [n, D], as rotary_attention takes them
        H, KVH, D = self.n_heads, self.n_kv, self.head_dim
        kept = {}  # the inputs of the layers an EAGLE-3 drafter reads
        # The residual adds and the norms after them go in pairs through norm.add_rms_norm (the
        # same bits as the ops, two calls a layer instead of ~14); the first layer's input norm
        # has no add before it.
        h = _rms_norm(x, self.layers[0].input_norm, self.eps)
        for i, layer in enumerate(self.layers):
            if i in self.aux_layers:
                kept[i] = x
            if layer.qkv is not None and layer.q_norm is None:
                # Rotation, the cache's new rows and attention in one kernel call (the same bits
                # as the ops below, a dozen fewer operator calls a layer).
                qkv = gguf_linear.linear_group(h, *layer.qkv)
                out = attention.rotary_attention(qkv, cos_rows, sin_rows, self.kv.k, self.kv.v, i, start, H, KVH, self.scaling)
            else:
                q, k, v = self._project(layer, h, n, cos, sin)
                self.kv.k[i, :, start:end] = k.transpose(0, 1)
                self.kv.v[i, :, start:end] = v.transpose(0, 1)
                keys, values = self.kv.k[i : i + 1, :, :end], self.kv.v[i : i + 1, :, :end]
                query = q.transpose(0, 1).unsqueeze(0)  # [1, H, n, D], head_dim contiguous
                out = attention.causal_attention(query, keys, values, self.scaling)[0].reshape(n, H * D)
            x, h = norm.add_rms_norm(x, layer.o(out), layer.post_norm, self.eps)
            if layer.gate_up is not None:
                gate_up = gguf_linear.linear_group(h, *layer.gate_up)
                inner = layer.gate.out_features
                mlp = layer.down(F.silu(gate_up[:, :inner]) * gate_up[:, inner:])
            else:
                mlp = layer.down(F.silu(layer.gate(h)) * layer.up(h))
            if i + 1 < len(self.layers):
                x, h = norm.add_rms_norm(x, mlp, self.layers[i + 1].input_norm, self.eps)
            else:
                x = x + mlp
        self._record(start, ids)
        if self.aux_layers:
            kept[len(self.layers)] = x
            self.aux, self.aux_start = torch.cat([kept[i] for i in self.aux_layers], dim=-1), start
        return _rms_norm(x[-n_last:], self.final_norm, self.eps)

    def _project(self, layer: _Layer, h: torch.Tensor, n: int, cos: torch.Tensor, sin: torch.Tensor):
        """q [n, H, D], k and v [n, KVH, D] of a layer whose projections are not one plain group
        (separate calls, or Qwen3's per-head norms before the rotation), rotated."""
        H, KVH, D = self.n_heads, self.n_kv, self.head_dim
        if layer.qkv is not None:
            qkv = gguf_linear.linear_group(h, *layer.qkv)
            qk, v = qkv[:, : (H + KVH) * D].view(n, H + KVH, D), qkv[:, (H + KVH) * D :].view(n, KVH, D)
            q = _rotate(_rms_norm(qk[:, :H], layer.q_norm, self.eps), cos, sin)
            k = _rotate(_rms_norm(qk[:, H:], layer.k_norm, self.eps), cos, sin)
            return q, k, v
        q = layer.q(h).view(n, H, D)
        k = layer.k(h).view(n, KVH, D)
        v = layer.v(h).view(n, KVH, D)
        if layer.q_norm is not None:
            q, k = _rms_norm(q, layer.q_norm, self.eps), _rms_norm(k, layer.k_norm, self.eps)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def forward(self, token_ids: list[int] | torch.Tensor, n_logits: int = 1) -> torch.Tensor:
        """Logits through the model's own LM head, as ModelRunner.forward."""
        hidden = self.forward_hidden(token_ids, n_last=n_logits)
        with torch.inference_mode():
            return self.head(hidden).float()
