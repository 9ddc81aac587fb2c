"""A tiny random GLM-4.5-style MoE model whose checkpoint carries an MTP layer, built offline.

Real DeepSeek-V3 / GLM-4.x checkpoints store their MTP layer as one more decoder layer after the
main ones (``model.layers.{num_hidden_layers}.*``) plus ``enorm``, ``hnorm``, ``eh_proj`` and
``shared_head.norm``; transformers skips those keys when it loads the main model and
``MtpModel.from_pretrained`` reads them back. We write exactly that layout: save a model with one
extra layer, add the four MTP-only tensors, and declare one layer fewer in config.json.

As for the Gemma 4 toys, weights are steered so drafts are partly accepted: the main model is a
bigram model plus small context-dependent terms, and the MTP layer predicts that bigram map.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

MAIN_LAYERS = 2


def glm_mtp_config(vocab_size: int, layers: int = MAIN_LAYERS, max_positions: int = 512):
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        num_mtp_layers=1,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
    )


@torch.no_grad()
def _steer(model, nudge: float, seed: int) -> None:
    """Unit-RMS token embeddings, unit-gain layer weights whose output projections are scaled so
    the layers together add about ``nudge`` x the embedding, and a confident untied LM head."""
    gen = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    model.model.embed_tokens.weight.normal_(0.0, 1.0, generator=gen)
    weights = [(n, p) for n, p in model.model.layers.named_parameters() if p.dim() >= 2]
    outputs = [n for n, _ in weights if n.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj"))]
    for name, p in weights:
        gain = nudge / len(outputs) ** 0.5 if name in outputs else 1.0
        p.normal_(0.0, gain / p.shape[-1] ** 0.5, generator=gen)  # last dim = fan-in
    model.lm_head.weight.normal_(0.0, 4.0 / hidden**0.5, generator=gen)


def save_tiny_mtp_model(directory: Path, tokenizer, seed: int = 0, nudge: float = 0.6, with_mtp: bool = True) -> Path:
    """Write the model (and ``tokenizer``) to ``directory``; ``with_mtp=False`` leaves the MTP
    weights out while the config still declares one layer (as a pruned checkpoint would)."""
    from safetensors.torch import load_file, save_file
    from transformers import Glm4MoeForCausalLM

    from engine.testing.tiny_gemma4 import padded_vocab

    directory = Path(directory)
    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(glm_mtp_config(padded_vocab(len(tokenizer)), MAIN_LAYERS + 1)).eval()
    _steer(model, nudge, seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    weights = load_file(directory / "model.safetensors")
    mtp = f"model.layers.{MAIN_LAYERS}."
    if with_mtp:
        hidden = model.config.hidden_size
        gen = torch.Generator().manual_seed(seed + 1)
        eh = torch.randn(hidden, 2 * hidden, generator=gen) * (0.1 / (2 * hidden) ** 0.5)
        eh[:, :hidden] += torch.eye(hidden)  # mostly the next token's embedding: a bigram guess
        weights.update({
            mtp + "enorm.weight": torch.ones(hidden),
            mtp + "hnorm.weight": torch.ones(hidden),
            mtp + "eh_proj.weight": eh,
            mtp + "shared_head.norm.weight": torch.ones(hidden),
        })
    else:
        weights = {k: v for k, v in weights.items() if not k.startswith(mtp)}
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["num_hidden_layers"] = MAIN_LAYERS
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory
