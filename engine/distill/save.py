"""Saving a drafter in the Speculators format (vLLM's), which engine.models.planning.
speculators_config reads back and vLLM serves: config.json with ``speculators_model_type``,
``speculators_config`` (algorithm, proposal methods, verifier) and the layer's own config,
model.safetensors with the layer, the head, d2t / t2d, and no embedding (the verifier's is read).
Written to a temporary name and renamed, so a kill mid-save never leaves half a drafter."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.drafters.eagle3_layers import Eagle3Layers

FORMAT_VERSION = "0.3.0"


def speculators_config(layers: Eagle3Layers, training: dict | None = None) -> dict:
    spec = layers.spec
    c = spec.layers
    layer_config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim, "intermediate_size": c.intermediate_size, "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_positions, "vocab_size": c.vocab_size, "hidden_act": "silu",
        "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling, "attention_bias": False, "tie_word_embeddings": False,
    }
    document = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": FORMAT_VERSION,
        "draft_vocab_size": spec.draft_vocab_size,
        "norm_before_residual": spec.norm_before_residual,
        "target_hidden_size": spec.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(spec.aux_layer_ids) if spec.aux_layer_ids else None,
        "transformer_layer_config": layer_config,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": spec.speculative_tokens or 3}],
            "verifier": {"name_or_path": spec.verifier_name, "architectures": list(spec.verifier_architectures)},
        },
    }
    if training:
        document["tandem_training"] = training  # how it was made: data, time, held-out figures
    return document


def save_speculators(layers: Eagle3Layers, folder: Path, training: dict | None = None) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for key, value in layers.state_dict().items():
        if key.startswith("embed_tokens") or key.startswith("fc_norm"):
            continue
        tensors[key] = value.detach().to("cpu", torch.bfloat16 if value.is_floating_point() else value.dtype).contiguous()
    ids = layers.target_ids(torch.arange(layers.spec.draft_vocab_size, device=layers.d2t.device)).cpu()
    t2d = torch.zeros(layers.spec.layers.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    weights_tmp = folder / "model.safetensors.partial"
    save_file(tensors, str(weights_tmp))
    config_tmp = folder / "config.json.partial"
    config_tmp.write_text(json.dumps(speculators_config(layers, training), indent=2))
    os.replace(weights_tmp, folder / "model.safetensors")
    os.replace(config_tmp, folder / "config.json")
    return folder
