"""Tiny GGUF files written from tiny random transformers models, as llama.cpp's converter would.

gguf-py (``gguf.GGUFWriter``, ``gguf.quants.quantize``) writes them: the architecture's metadata,
the tokenizer as ``tokenizer.ggml.*`` keys (a byte-level BPE: tokens, token types, merges,
special ids, chat template), and the tensors under GGUF's names, matrices quantized to the
type asked for (gguf-py quantizes Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; K-quants it only reads).
Llama's Q and K rows are permuted for llama.cpp's rotary layout exactly as convert_hf_to_gguf
does, so a loader must undo it.

``dequantized_copy`` gives the fp32 transformers model holding the weights the file stands for
(quantized, then dequantized): the oracle a native GGUF load is checked against.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch

_ARCHS = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama"}
# general.file_type for a file whose matrices are all of one type (llama.cpp's names).
_FILE_TYPE_NAMES = {"F32": "ALL_F32", "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M"}


def _file_type(qtype: str) -> int:
    from gguf import LlamaFileType

    name = _FILE_TYPE_NAMES.get(qtype, f"MOSTLY_{qtype}")
    return LlamaFileType[name] if name in LlamaFileType.__members__ else LlamaFileType.GUESSED


def build_model(model_type: str, vocab_size: int, hidden: int = 64, layers: int = 2, seed: int = 0,
                tie_word_embeddings: bool = False, init: float = 0.5):
    """A random fp32 causal LM of ``model_type`` ("qwen2", "qwen3", "llama"): 4 heads, 2 KV heads,
    head_dim hidden / 4. The default ``init`` (weights' std) gives confident, varied greedy
    choices; such a model is chaotic (small input changes grow layer by layer), a smaller one
    (0.1) is tame."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
               "llama": (LlamaConfig, LlamaForCausalLM)}
    config_class, model_class = classes[model_type]
    extra = {"head_dim": hidden // 4} if model_type == "qwen3" else {}
    config = config_class(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=init,
        tie_word_embeddings=tie_word_embeddings, eos_token_id=2, bos_token_id=None, pad_token_id=0,
        rms_norm_eps=1e-6, **extra,
    )
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():  # random norm weights and biases, so a loader that drops them is caught
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.5 * torch.randn_like(p))
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py's LlamaModel.permute: Q/K rows to llama.cpp's rotary layout.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(model) -> dict[str, np.ndarray]:
    """The model's tensors under GGUF names, as llama.cpp writes them (fp32 numpy)."""
    import gguf

    config = model.config
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == _ARCHS[config.model_type])
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    out = {}
    for hf_name, tensor in model.state_dict().items():
        if config.tie_word_embeddings and hf_name == "lm_head.weight":
            continue
        base, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(base)
        if name is None:
            raise KeyError(f"no GGUF name for {hf_name}")
        w = tensor.detach().float().numpy().copy()
        if config.model_type == "llama" and name.endswith(("attn_q", "attn_k")):
            heads = config.num_attention_heads if name.endswith("attn_q") else config.num_key_value_heads
            w = _permute(w, heads)
        out[f"{name}.{suffix}"] = w
    return out


def _write_tokenizer(writer, tokenizer) -> None:
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    special = {t["content"]: t["id"] for t in state["added_tokens"]}
    by_id = {i: t for t, i in vocab.items()} | {i: t for t, i in special.items()}
    tokens = [by_id[i] for i in range(len(by_id))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokenizer.convert_tokens_to_ids(tokenizer.eos_token))
    writer.add_pad_token_id(tokenizer.convert_tokens_to_ids(tokenizer.pad_token))
    writer.add_bos_token_id(tokenizer.convert_tokens_to_ids(tokenizer.pad_token))
    writer.add_add_bos_token(False)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def _encode(name: str, w: np.ndarray, qtype: str):
    """(data, raw_dtype) for GGUFWriter.add_tensor: vectors stay F32 (llama.cpp keeps norms and
    biases at F32), matrices take ``qtype``. A type gguf-py cannot quantize (the K-quants, IQ
    types) gets random bytes of the right size: such a file tests what a loader refuses."""
    from gguf import GGMLQuantizationType, quants

    if w.ndim == 1 or qtype == "F32":
        return w.astype(np.float32), None
    if qtype == "F16":
        return w.astype(np.float16), None
    t = GGMLQuantizationType[qtype]
    try:
        return quants.quantize(w.astype(np.float32), t), t
    except NotImplementedError:
        return random_blocks(w.shape, t), t


# Where a K-quant block keeps its fp16 scales (d, then dmin where it has one).
_K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(shape: tuple[int, ...], qtype, seed: int = 0) -> np.ndarray:
    """Random blocks of ``qtype`` for a [rows, K] tensor: random codes, and for the K-quants
    small fp16 super-block scales (random bytes there would give inf and NaN weights)."""
    from gguf import quants

    blocks = np.random.default_rng(seed).integers(0, 256, size=quants.quant_shape_to_byte_shape(shape, qtype), dtype=np.uint8)
    size = blocks.shape[-1] // (shape[-1] // 256) if qtype.name in _K_SCALES else 0
    for at in _K_SCALES.get(qtype.name, ()):
        scale = np.frombuffer(np.float16(1e-3 if qtype.name != "Q6_K" else 1e-4).tobytes(), dtype=np.uint8)
        view = blocks.reshape(*blocks.shape[:-1], -1, size)
        view[..., at:at + 2] = scale
    return blocks


def write_gguf(model, tokenizer, path: Path, qtype: str = "Q8_0", types: dict[str, str] | None = None,
               split_max_tensors: int = 0, with_tokenizer: bool = True, architecture: str | None = None,
               skip_keys: tuple[str, ...] = ()) -> Path:
    """Write ``model`` (+ tokenizer metadata) to ``path`` as GGUF; matrices in ``qtype`` except
    where ``types`` ({gguf tensor name: type}) says otherwise. ``split_max_tensors`` > 0 writes a
    split model (path-00001-of-0000N.gguf ...); returns the (first) file's path. For files a
    loader must refuse: ``architecture`` names another one in the metadata, ``skip_keys`` are
    metadata keys left out."""
    import gguf

    config = model.config
    path = Path(path)
    writer = gguf.GGUFWriter(path, architecture or _ARCHS[config.model_type], split_max_tensors=split_max_tensors)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_name(f"tiny-{config.model_type}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(_file_type(qtype))
    if with_tokenizer:
        _write_tokenizer(writer, tokenizer)
    for name, w in _tensors(model).items():
        data, raw_dtype = _encode(name, w, (types or {}).get(name, qtype))
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    for key in skip_keys:
        writer.kv_data[0].pop(key, None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors:
        return next(iter(sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))))
    return path


def write_gguf_pair(folder: Path, layers: int = 2) -> tuple[Path, Path]:
    """A Q4_0 target and a Q8_0 drafter (the target's weights, perturbed: it agrees with the
    target often, not always) in ``folder``."""
    from engine.testing.tiny_models import build_tokenizer, perturbed_copy

    tokenizer = build_tokenizer()
    target = build_model("qwen2", len(tokenizer), layers=layers)
    drafter = perturbed_copy(target, 0.005, seed=7)
    return (write_gguf(target, tokenizer, Path(folder) / "target-q4_0.gguf", "Q4_0"),
            write_gguf(drafter, tokenizer, Path(folder) / "drafter-q8_0.gguf", "Q8_0"))


def dequantized_copy(model, path: Path):
    """An fp32 copy of ``model`` holding exactly the weights the GGUF file at ``path`` stands
    for (each tensor quantized as written there, then dequantized by gguf-py)."""
    import gguf

    from engine.gguf.reader import open_gguf

    file = open_gguf(path)
    oracle = copy.deepcopy(model).float()
    config = model.config
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == _ARCHS[config.model_type])
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    with torch.no_grad():
        for hf_name, param in oracle.state_dict().items():
            base, suffix = hf_name.rsplit(".", 1)
            name = f"{names.get_name(base)}.{suffix}"
            if name not in file.tensors:  # the tied LM head
                name = "token_embd.weight"
            tensor = file.tensors[name]
            w = gguf.quants.dequantize(tensor.data.numpy(), gguf.GGMLQuantizationType[tensor.type_name])
            w = np.asarray(w, dtype=np.float32).reshape(param.shape)
            if config.model_type == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
                heads = config.num_attention_heads if "attn_q" in name else config.num_key_value_heads
                w = _unpermute(w, heads)
            param.copy_(torch.from_numpy(w))
    return oracle


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
