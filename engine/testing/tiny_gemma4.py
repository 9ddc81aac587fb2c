"""Tiny random Gemma 4 targets and Gemma 4 assistant drafters, built offline from configs.

Layouts mirror the real families at toy size:

    e2b    Gemma4ForCausalLM with per-layer embeddings (PLE) and KV-shared layers, like E2B/E4B
    dense  Gemma4ForConditionalGeneration (text only), no KV sharing, keys = values on full
           attention layers with fewer KV heads, a small MoE block: like 26B-A4B / 31B

Random weights would make an assistant that never agrees with its target, so both are steered
(see ``steer_target`` / ``steer_assistant``): the target is close to a bigram model (each layer
adds a small, context-dependent nudge to the token's embedding) and the assistant reproduces
that bigram map from the target embedding it is given, through its own layers reading the
target's K/V. Acceptance is then partial, like a real pair's. Speculative decoding's guarantees
hold for any weights, so these are enough to test them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

Layout = Literal["e2b", "dense"]

SLIDING, FULL = "sliding_attention", "full_attention"
#: Groups of similar LM-head rows in a tiny target; vocabulary sizes must be multiples of it.
CLUSTERS = 16


def padded_vocab(n_tokens: int) -> int:
    """The model vocabulary for a tokenizer of ``n_tokens``: rounded up to a multiple of CLUSTERS
    (real checkpoints pad their embedding too)."""
    return -(-n_tokens // CLUSTERS) * CLUSTERS


def gemma4_text_config(vocab_size: int, layout: Layout = "e2b", sliding_window: int = 8, max_positions: int = 512):
    """A Gemma4TextConfig at toy size (hidden 64, 6 or 4 layers, sliding window 8 so that tests
    run past it)."""
    from transformers import Gemma4TextConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        sliding_window=sliding_window,
        max_position_embeddings=max_positions,
        final_logit_softcapping=30.0,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=None,
        pad_token_id=0,
    )
    if layout == "e2b":
        return Gemma4TextConfig(
            **common,
            num_hidden_layers=6,
            layer_types=[SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL],
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=vocab_size,
            num_kv_shared_layers=2,  # layers 4-5 reuse the K/V that layers 2 (full) and 3 store
        )
    if layout == "dense":
        return Gemma4TextConfig(
            **common,
            num_hidden_layers=4,
            layer_types=[SLIDING, FULL, SLIDING, FULL],
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0,
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=32,
        )
    raise ValueError(f"unknown layout {layout!r}")


def build_gemma4_target(vocab_size: int, layout: Layout = "e2b", seed: int = 0, nudge: float = 0.2, sliding_window: int = 8):
    """A random, steered Gemma 4 target: Gemma4ForCausalLM ("e2b") or a text-only
    Gemma4ForConditionalGeneration ("dense"). ``nudge`` sets how far context moves it from a
    bigram model (0 = pure bigram, which an assistant predicts perfectly)."""
    from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    text = gemma4_text_config(vocab_size, layout, sliding_window)
    torch.manual_seed(seed)
    if layout == "dense":
        config = Gemma4Config(text_config=text, vision_config=None, audio_config=None, tie_word_embeddings=False)
        model = Gemma4ForConditionalGeneration(config)
    else:
        model = Gemma4ForCausalLM(text)
    steer_target(model, nudge, seed)
    return model.eval()


def assistant_config(target_config, hidden: int = 64, layers: int = 2, centroids: bool = True, **overrides):
    """A Gemma4AssistantConfig fitted to ``target_config`` (vocab, backbone hidden size, per-type
    head dims and KV heads, window, rope). ``overrides`` change text-config fields, e.g. to build
    a mismatched assistant."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4_assistant import Gemma4AssistantConfig

    t = target_config.get_text_config()
    full, sliding = t.per_layer_config[FULL], t.per_layer_config[SLIDING]
    fields = dict(
        vocab_size=t.vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=sliding.num_key_value_heads,
        head_dim=sliding.head_dim,
        global_head_dim=full.head_dim,
        attention_k_eq_v=t.attention_k_eq_v,
        num_global_key_value_heads=full.num_key_value_heads,
        layer_types=([SLIDING] * (layers - 1) + [FULL]),
        sliding_window=t.sliding_window,
        rope_parameters=t.rope_parameters,
        max_position_embeddings=t.max_position_embeddings,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        tie_word_embeddings=True,
    )
    fields.update(overrides)
    vocab = fields["vocab_size"]
    return Gemma4AssistantConfig(
        text_config=Gemma4TextConfig(**fields),
        backbone_hidden_size=t.hidden_size,
        use_ordered_embeddings=centroids,
        num_centroids=CLUSTERS,
        centroid_intermediate_top_k=4,
    )


def build_gemma4_assistant(target, seed: int = 0, centroids: bool = True, nudge: float = 0.1, **overrides):
    """A random Gemma4AssistantForCausalLM for ``target``, steered to predict the target's
    bigram map; ``centroids`` gives it the E2B/E4B centroid-masked head."""
    from transformers.models.gemma4_assistant import Gemma4AssistantForCausalLM

    torch.manual_seed(seed + 1000)
    assistant = Gemma4AssistantForCausalLM(assistant_config(target.config, centroids=centroids, **overrides))
    if overrides:  # a deliberately mismatched assistant: its weights need not make sense
        return assistant.eval()
    steer_assistant(assistant, target, nudge, seed)
    return assistant.eval()


@torch.no_grad()
def steer_target(model, nudge: float, seed: int) -> None:
    """Make the target a bigram model plus context: the sublayers' post-norm outputs (attention,
    MLP, per-layer input) together add about ``nudge`` x the embedding's RMS. The untied LM head
    gives confident logits (std ~4) and has CLUSTERS groups of similar rows (token t in group
    t % CLUSTERS), as a trained vocabulary has groups of related tokens; the centroid head of
    the E2B/E4B assistants relies on that."""
    decoder = model.get_decoder()
    gen = torch.Generator().manual_seed(seed)
    hidden = decoder.config.hidden_size
    embed = decoder.embed_tokens
    embed.weight.normal_(0.0, 1.0 / hidden**0.5, generator=gen)
    scale = float(embed(torch.arange(embed.num_embeddings)).pow(2).mean().sqrt())
    norms = [
        norm
        for layer in decoder.layers
        for name in ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm")
        if (norm := getattr(layer, name, None)) is not None
    ]
    for norm in norms:  # independent contributions add up in quadrature
        norm.weight.fill_(nudge * scale / len(norms) ** 0.5)
    head = model.get_output_embeddings().weight
    vocab = head.shape[0]
    centers = torch.randn(CLUSTERS, hidden, generator=gen)
    rows = centers[torch.arange(vocab) % CLUSTERS] + torch.randn(vocab, hidden, generator=gen)
    head.copy_(rows * (4.0 / (2 * hidden) ** 0.5))


@torch.no_grad()
def steer_assistant(assistant, target, nudge: float, seed: int) -> None:
    """The assistant's input is cat(target embedding of the token, target hidden state):
    pre_projection passes the embedding half through (plus a little of the hidden state), its
    layers add about ``nudge`` x more (which depends on the target's K/V), and its LM head is the
    target's, so it predicts the target's bigram successor. The centroid head's clusters are the
    target head's groups of similar rows and each centroid is its group's mean row, as k-means
    on a trained head would give."""
    gen = torch.Generator().manual_seed(seed + 7)
    h_a = assistant.config.get_text_config().hidden_size
    h_t = assistant.config.backbone_hidden_size
    scale = float(target.get_input_embeddings()(torch.arange(8)).pow(2).mean().sqrt())
    pre = torch.randn(h_a, 2 * h_t, generator=gen) * (nudge / (2 * h_t) ** 0.5)
    pre[:, :h_t] = torch.eye(h_a, h_t) if h_a == h_t else torch.randn(h_a, h_t, generator=gen) / h_t**0.5
    assistant.pre_projection.weight.copy_(pre)
    norms = [getattr(layer, name) for layer in assistant.model.layers
             for name in ("post_attention_layernorm", "post_feedforward_layernorm")]
    for norm in norms:
        norm.weight.fill_(nudge * scale / len(norms) ** 0.5)
    if h_a == h_t:
        assistant.lm_head.weight.copy_(target.get_output_embeddings().weight)
    masked = assistant.masked_embedding
    if masked is not None:
        vocab, groups = masked.vocab_size, masked.num_centroids
        order = torch.arange(vocab).view(-1, groups).t().reshape(-1)  # group g: tokens g, g+G, ...
        masked.token_ordering.copy_(order)
        masked.centroids.weight.copy_(assistant.lm_head.weight[order.view(groups, -1)].mean(dim=1))


def save_gemma4_pair(directory: Path, layout: Layout = "e2b", seed: int = 0) -> tuple[Path, Path]:
    """Write a tiny Gemma 4 target (with the tiny BPE tokenizer) and its assistant (no tokenizer,
    like the real ``-assistant`` repos) as model folders; returns their paths."""
    from engine.testing.tiny_models import build_tokenizer

    tokenizer = build_tokenizer()
    target = build_gemma4_target(padded_vocab(len(tokenizer)), layout, seed)
    assistant = build_gemma4_assistant(target, seed)
    target_dir = Path(directory) / f"tiny-gemma4-{layout}"
    assistant_dir = Path(directory) / f"tiny-gemma4-{layout}-assistant"
    target.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    assistant.save_pretrained(assistant_dir)
    return target_dir, assistant_dir
