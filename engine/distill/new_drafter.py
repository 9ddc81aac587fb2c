"""A new EAGLE-3 drafter for a target that has none: its shape, its draft vocabulary, and a start
that already predicts something (the target's own final norm and LM head rows).

Its layer takes the target's hidden size, attention heads and rotary embedding (so it reads the
target's states in their own geometry) with a narrower MLP (``inner``): the draft step must cost
a small fraction of a target step, and the head's rows are the largest part of it.
"""
from __future__ import annotations

from collections import Counter

import torch

from engine.drafters.eagle3_layers import Eagle3Layers
from engine.gguf.modules import DenseLinear, GgufLinear
from engine.models.planning.speculators_config import DraftLayers, SpeculatorSpec, default_aux_layers


def spec_for_target(config, verifier_name: str, draft_vocab_size: int, inner: int | None = None,
                    aux_layers: tuple[int, ...] | None = None) -> SpeculatorSpec:
    """The spec of a one-layer EAGLE-3 drafter for a target with transformers ``config``."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    rope = getattr(c, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"} if rope.get("rope_type", "default") != "default" else None
    layers = DraftLayers(
        model_type="llama", hidden_size=c.hidden_size, num_layers=1, heads=heads,
        kv_heads=getattr(c, "num_key_value_heads", heads), head_dim=head_dim,
        intermediate_size=inner or min(c.intermediate_size, 2 * c.hidden_size), rms_norm_eps=float(c.rms_norm_eps),
        rope_theta=theta, rope_scaling=scaling, max_positions=int(c.max_position_embeddings), vocab_size=c.vocab_size,
        attention_bias=False, sliding_window=None, qk_norm=False,
    )
    return SpeculatorSpec(
        algorithm="eagle3", layout="speculators", layers=layers, draft_vocab_size=min(draft_vocab_size, c.vocab_size),
        target_hidden_size=c.hidden_size, aux_layer_ids=aux_layers or default_aux_layers(c.num_hidden_layers),
        norm_before_residual=False, norm_before_fc=False, verifier_name=verifier_name,
        verifier_architectures=tuple(getattr(config, "architectures", None) or ()), speculative_tokens=3,
    )


def draft_vocabulary(token_counts: Counter, vocab_size: int, size: int) -> list[int]:
    """The ``size`` ids the data uses most (then the lowest others), sorted: the drafter's head
    rows. Tokens outside it are never drafted; the target still produces them."""
    chosen = [t for t, _ in token_counts.most_common(size)]
    if len(chosen) < size:
        have = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in have][: size - len(chosen)]
    return sorted(chosen)


def head_rows(head: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """fp32 rows ``ids`` of a target's LM head: a GGUF file's quantized rows dequantized
    (GgufLinear.dense_rows), else the weight's rows."""
    index = torch.tensor(ids, dtype=torch.long)
    if isinstance(head, (GgufLinear, DenseLinear)):
        return torch.cat([head.dense_rows(index[i : i + 4096]).float() for i in range(0, len(ids), 4096)])
    return head.weight.detach()[index].float()


def new_drafter(spec: SpeculatorSpec, draft_ids: list[int], target_head: torch.nn.Module, target_norm: torch.Tensor,
                seed: int = 0) -> Eagle3Layers:
    """Fresh layers: small random projections, the final norm and head rows copied from the
    target (a drafter that starts out reading the target's vocabulary as the target does)."""
    generator = torch.Generator().manual_seed(seed)
    layers = Eagle3Layers(spec, qk_norm=False, bias=False, own_embedding=False, fc_norm=False)
    with torch.no_grad():
        for name, parameter in layers.named_parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * (0.5 / parameter.shape[1] ** 0.5))
        # The layer adds to the combined states; start it near nothing so the head reads them.
        layers.layers[0].self_attn.o_proj.weight.mul_(0.1)
        layers.layers[0].mlp.down_proj.weight.mul_(0.1)
        layers.norm.weight.copy_(target_norm.float())
        layers.lm_head.weight.copy_(head_rows(target_head, draft_ids))
        ids = torch.tensor(draft_ids, dtype=torch.long)
        layers.d2t = ids - torch.arange(len(draft_ids))
    return layers
