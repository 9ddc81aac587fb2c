"""Tiny EAGLE-3 checkpoints in the published layouts, written by test code alone (it never
imports the engine's reader or layers): the Speculators format (vLLM's; RedHatAI's drafters)
and the EAGLE authors' own (``LlamaForCausalLMEagle3``, one ``midlayer``; AngelSlim's).

``copy_of_target`` makes a drafter that mostly repeats the target's own next-token guess: fc
picks the state of the last layer's output, the norm and head are the target's, and the
attention and MLP add a little noise. Its drafts are accepted where the target repeats itself
and rejected elsewhere, so tests see partial acceptance; a random drafter is accepted almost
never.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def layer_config(target, hidden: int | None = None, heads: int = 4, kv_heads: int = 2, vocab: int | None = None) -> dict:
    c = target.config
    hidden = hidden or c.hidden_size
    return {
        "model_type": "llama", "hidden_size": hidden, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hidden // heads, "intermediate_size": 2 * hidden,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": 10000.0, "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": vocab or c.vocab_size, "hidden_act": "silu", "tie_word_embeddings": False,
    }


def random_weights(config: dict, draft_vocab: int, target_hidden: int, seed: int, scale: float = 0.3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    H, heads, kv, D, inner = (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"],
                              config["head_dim"], config["intermediate_size"])

    def rand(*shape):
        return torch.randn(*shape, generator=g) * scale / shape[-1] ** 0.5 * 4

    return {
        "fc.weight": rand(H, 3 * target_hidden),
        "layers.0.self_attn.q_proj.weight": rand(heads * D, 2 * H),
        "layers.0.self_attn.k_proj.weight": rand(kv * D, 2 * H),
        "layers.0.self_attn.v_proj.weight": rand(kv * D, 2 * H),
        "layers.0.self_attn.o_proj.weight": rand(H, heads * D),
        "layers.0.mlp.gate_proj.weight": rand(inner, H),
        "layers.0.mlp.up_proj.weight": rand(inner, H),
        "layers.0.mlp.down_proj.weight": rand(H, inner),
        "layers.0.input_layernorm.weight": torch.ones(H),
        "layers.0.post_attention_layernorm.weight": torch.ones(H),
        "layers.0.hidden_norm.weight": torch.ones(H),
        "norm.weight": torch.ones(H),
        "lm_head.weight": rand(draft_vocab, H),
    }


def copy_of_target(target, noise: float = 0.05, seed: int = 0, draft_ids: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Weights (ids (0, L//2, L): the last id is the final layer's output) that mostly repeat
    the target's next-token guess; ``draft_ids``: the target ids its reduced head keeps."""
    H = target.config.hidden_size
    config = layer_config(target)
    vocab = target.config.vocab_size
    ids = draft_ids if draft_ids is not None else list(range(vocab))
    weights = random_weights(config, len(ids), H, seed, scale=noise)
    fc = torch.zeros(H, 3 * H)
    fc[:, 2 * H:] = torch.eye(H)
    weights["fc.weight"] = fc
    weights["layers.0.hidden_norm.weight"] = torch.ones(H)
    weights["norm.weight"] = target.model.norm.weight.detach().float().clone()
    weights["lm_head.weight"] = target.lm_head.weight.detach().float()[ids].clone()
    return weights


def vocabulary_maps(draft_ids: list[int], vocab: int) -> dict[str, torch.Tensor]:
    d2t = torch.tensor([t - d for d, t in enumerate(draft_ids)], dtype=torch.long)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids] = True
    return {"d2t": d2t, "t2d": t2d}


def save_speculators(folder: Path, target, weights: dict[str, torch.Tensor], aux_ids: list[int] | None,
                     verifier: str = "tiny-target", draft_ids: list[int] | None = None, config: dict | None = None,
                     embed: bool = False, embed_dtype: torch.dtype = torch.float32) -> Path:
    """vLLM's Speculators layout: speculators_* keys, the layer config nested, no embedding
    (the verifier's is used) unless ``embed`` (stored as ``embed_dtype``: the published ones are
    bf16)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = config or layer_config(target)
    draft_vocab = weights["lm_head.weight"].shape[0]
    tensors = dict(weights)
    if draft_ids is not None:
        tensors.update(vocabulary_maps(draft_ids, target.config.vocab_size))
    if embed:
        tensors["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().to(embed_dtype).clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    document = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": False,
        "target_hidden_size": None,
        "transformer_layer_config": config,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": verifier, "architectures": ["Qwen2ForCausalLM"]},
        },
    }
    if aux_ids is not None:
        document["eagle_aux_hidden_state_layer_ids"] = aux_ids
    (folder / "config.json").write_text(json.dumps(document, indent=2))
    return folder


def save_eagle_authors(folder: Path, target, weights: dict[str, torch.Tensor], aux_ids: list[int] | None,
                       draft_ids: list[int] | None = None) -> Path:
    """The EAGLE authors' layout: a flat Llama config, the layer stored as ``midlayer``, the
    embedding shipped with the drafter, d2t / t2d always present."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = target.config.vocab_size
    ids = draft_ids if draft_ids is not None else list(range(vocab))
    tensors = {k.replace("layers.0.", "midlayer."): v for k, v in weights.items()}
    tensors.update(vocabulary_maps(ids, vocab))
    tensors["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().float().clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    document = {"architectures": ["LlamaForCausalLMEagle3"], **layer_config(target), "draft_vocab_size": len(ids)}
    if aux_ids is not None:
        document["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_ids, "use_aux_hidden_state": True}
    (folder / "config.json").write_text(json.dumps(document, indent=2))
    return folder


# -- DFlash ---------------------------------------------------------------------------------------

def dflash_weights(target, layers: int, n_ids: int, seed: int, vocab: int | None = None, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """Random Qwen3-style block layers reading ``n_ids`` target layers; with ``vocab``, a head of
    its own over that many ids."""
    g = torch.Generator().manual_seed(seed)
    H = target.config.hidden_size
    heads, kv, D, inner = 4, 2, H // 4, 2 * H

    def rand(*shape):
        return torch.randn(*shape, generator=g) * scale / shape[-1] ** 0.5 * 4

    weights = {"fc.weight": rand(H, n_ids * H), "hidden_norm.weight": torch.ones(H), "norm.weight": torch.ones(H)}
    for i in range(layers):
        p = f"layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": rand(heads * D, H), p + "self_attn.k_proj.weight": rand(kv * D, H),
            p + "self_attn.v_proj.weight": rand(kv * D, H), p + "self_attn.o_proj.weight": rand(H, heads * D),
            p + "self_attn.q_norm.weight": torch.ones(D), p + "self_attn.k_norm.weight": torch.ones(D),
            p + "mlp.gate_proj.weight": rand(inner, H), p + "mlp.up_proj.weight": rand(inner, H),
            p + "mlp.down_proj.weight": rand(H, inner),
            p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
        })
    if vocab is not None:
        weights["lm_head.weight"] = rand(vocab, H)
    return weights


def _dflash_layer_config(target, layers: int) -> dict:
    return {**layer_config(target), "model_type": "qwen3", "num_hidden_layers": layers, "layer_types": ["full_attention"] * layers}


def save_dflash_authors(folder: Path, target, layer_ids: list[int], mask_token_id: int, block_size: int = 8,
                        layers: int = 2, seed: int = 0) -> Path:
    """z-lab's layout: a flat Qwen3 config (DFlashDraftModel), ``dflash_config`` with the mask
    token and the target layers (counted as layer outputs), no head and no embedding."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(dflash_weights(target, layers, len(layer_ids), seed), str(folder / "model.safetensors"))
    document = {"architectures": ["DFlashDraftModel"], **_dflash_layer_config(target, layers), "block_size": block_size,
                "num_target_layers": target.config.num_hidden_layers,
                "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": layer_ids}}
    (folder / "config.json").write_text(json.dumps(document, indent=2))
    return folder


def save_dflash_speculators(folder: Path, target, layer_ids: list[int], mask_token_id: int, draft_ids: list[int],
                            block_size: int = 8, layers: int = 1, seed: int = 0, verifier: str = "tiny-target") -> Path:
    """The Speculators layout of a DFlash drafter with a reduced head of its own (d2t / t2d)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = dflash_weights(target, layers, len(layer_ids), seed, vocab=len(draft_ids))
    tensors.update(vocabulary_maps(draft_ids, target.config.vocab_size))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    document = {
        "architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash", "speculators_version": "0.3.0",
        "draft_vocab_size": len(draft_ids), "block_size": block_size, "aux_hidden_state_layer_ids": layer_ids,
        "mask_token_id": mask_token_id, "transformer_layer_config": _dflash_layer_config(target, layers),
        "speculators_config": {"algorithm": "dflash", "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block_size - 1}],
                               "verifier": {"name_or_path": verifier, "architectures": ["Qwen2ForCausalLM"]}},
    }
    (folder / "config.json").write_text(json.dumps(document, indent=2))
    return folder
