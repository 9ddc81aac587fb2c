"""Run an int8 drafter's decoder one kernel call per layer (kernels.draft_decoder).

Same interface as ModelRunner (reset, forward_hidden, forward, crop, length) for the drafters
it supports: Llama / Qwen2-shaped models whose linear layers are Int8Linear (engine.quant.quantize),
with plain rotary embeddings and no sliding window. It reads the model's own int8 / int4 buffers
(a drafter's moved into huge pages where the kernel grants them: engine.models.runners.huge_pages) and
keeps its own key/value cache (engine.models.runners.own_cache_runner): fp32 for an int8 / int4
target, fp16 for a drafter (DRAFTER_KV_DTYPE), whose drafts may round as they like (the target
verifies them) and whose cache grows with a conversation as the target's does.
"""
from __future__ import annotations

import logging

import torch

from engine.models.planning.architecture import plain_causal_reason
from engine.models.runners.huge_pages import move_to_huge_pages
from engine.models.runners.own_cache_runner import OwnCacheRunner
from engine.quant.quantize import Int4Linear, Int8Linear
from kernels import draft_decoder
from kernels.norm.reference import rms_norm

log = logging.getLogger(__name__)


def _layer_parts(layer):
    attn, mlp = layer.self_attn, layer.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj


def _weight_buffers(part) -> tuple[str, ...]:
    """The buffers a step streams: int4 codes, scales and offsets, or int8 rows and scales."""
    return ("packed", "scale", "offset") if isinstance(part, Int4Linear) else ("q", "scale")


def worth_using(model) -> bool:
    """Where the fast kernel runs and the model fits (on the reference backend FusedRunner is
    correct but slower than transformers' own modules)."""
    reason = unsupported_reason(model)
    if reason is None and draft_decoder.fast_backend() is None:
        reason = "no fast draft_decoder kernel here"
    if reason:
        log.info("%s runs through transformers' modules: %s", getattr(model.config, "_name_or_path", "model") or "model", reason)
    return reason is None


def unsupported_reason(model) -> str | None:
    """None when FusedRunner can run ``model``, else why not."""
    config = model.config
    reason = plain_causal_reason(config)
    if reason is not None:
        return reason
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return "MLP is not a bias-free SwiGLU"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim % 8:
        return f"head size {head_dim} is not a multiple of 8 (the attention kernel's)"
    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") != "default":
        return "rotary embedding type"
    try:
        for layer in model.get_decoder().layers:
            parts = _layer_parts(layer)
            if not all(isinstance(p, (Int8Linear, Int4Linear)) for p in parts):
                return "linear layers are not int8 / int4"
            if any(p.bias is not None for p in parts[4:]):
                return "MLP has biases"
    except AttributeError as exc:
        return f"layer layout ({exc})"
    return None


#: A drafter's cache: half the memory of fp32 at long context, and half the bytes its attention
#: reads per draft step; what it does to acceptance `tandem bench` shows.
DRAFTER_KV_DTYPE = torch.float16


class FusedRunner(OwnCacheRunner):
    def __init__(self, model, initial_capacity: int = 256, huge_pages: bool = False,
                 kv_dtype: torch.dtype = torch.float32) -> None:
        """``huge_pages``: move the layers' weight buffers into huge pages (engine.models.runners.huge_pages;
        drafters: their cache file holds only these layers, so it is unmapped after the move).
        ``kv_dtype``: the cache's, fp32 or fp16."""
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"FusedRunner cannot run this model: {reason}")
        super().__init__(model)
        decoder = model.get_decoder()
        self.embed = model.get_input_embeddings()  # a table, or a GGUF file's rows (dequantized per lookup)
        moved = huge_pages and move_to_huge_pages(
            [(p, name) for layer in decoder.layers for p in _layer_parts(layer) for name in _weight_buffers(p)])
        if moved:
            log.info("%d MiB of layer weights in huge pages", moved >> 20)
        self.layers = []
        for layer in decoder.layers:
            parts = _layer_parts(layer)
            q, k, v, o, g, u, d = parts
            bias = lambda p: None if p.bias is None else p.bias.float()  # noqa: E731
            w = lambda p: p.packed if isinstance(p, Int4Linear) else p.q  # noqa: E731
            # int4 layers' offsets; int8 layers need none (an empty tensor marks them).
            offsets = [p.offset if isinstance(p, Int4Linear) else torch.empty(0) for p in parts]
            self.layers.append((
                layer.input_layernorm.weight.float(),
                w(q), q.scale, bias(q), w(k), k.scale, bias(k), w(v), v.scale, bias(v), w(o), o.scale, bias(o),
                layer.post_attention_layernorm.weight.float(),
                w(g), g.scale, w(u), u.scale, w(d), d.scale,
                offsets if any(isinstance(p, Int4Linear) for p in parts) else [],
                # int8 targets' layers round their inputs to int16 (Int8Linear.int16_inputs).
                any(isinstance(p, Int8Linear) and p.int16_inputs for p in parts),
            ))
        self._allocate_cache(len(self.layers), decoder.layers[0].self_attn.q_proj.out_features // self.n_heads, initial_capacity,
                             kv_dtype)

    @torch.inference_mode()
    def forward_hidden(self, token_ids: list[int], n_last: int = 1) -> torch.Tensor:
        """Feed ``token_ids`` after the cached ones; the final normed hidden states [n_last, H]."""
        n = len(token_ids)
        start, end = self._new_positions(n)
        x = self.embed(torch.tensor(token_ids)).float().contiguous()
        angles = torch.arange(self.length, end, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        cos = (angles.cos() * self.rope_scale).contiguous()
        sin = (angles.sin() * self.rope_scale).contiguous()
        for i, weights in enumerate(self.layers):
            *layer, offsets, int16_inputs = weights
            draft_decoder.decoder_layer(x, *layer, self.kv.k[i], self.kv.v[i], cos, sin, self.length, self.n_heads, self.n_kv, self.eps,
                                        offsets, int16_inputs)
        self._record(start, token_ids)
        return rms_norm(x[-n_last:], self.final_norm, self.eps)

    def forward(self, token_ids: list[int], n_logits: int = 1) -> torch.Tensor:
        """Logits through the model's own LM head, as ModelRunner.forward."""
        hidden = self.forward_hidden(token_ids, n_last=n_logits)
        with torch.inference_mode():
            return self.model.get_output_embeddings()(hidden).float()
