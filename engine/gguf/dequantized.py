"""The fp32 transformers model a GGUF file stands for: every tensor dequantized by gguf-py.

This is the reference a precision is measured against (engine.bench.fidelity): the file's own
weight values, exactly, computed in fp32 by transformers' plain modules. A bf16 conversion of
the file is not that model: a Q4_K value d*sc*q - dmin*m (fp16 d and dmin, 6-bit sc and m, 4-bit
q) needs more than bf16's 8 significant bits, and on the default target only ~2% of the Q4_K
weights survive bf16 storage unchanged.

Tensor names and per-architecture corrections (llama's Q/K row permutation, Gemma's 1 + w norms)
are the ones the native loader uses (engine.gguf.model), so the two models differ only in how
they compute, never in which weights they hold.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine.core.heap import release_freed_memory
from engine.gguf import metadata_cache
from engine.gguf.model import _gguf_names, _set_parameter, check_architecture, read_config
from engine.gguf.reader import GgufError, GgufTensor

log = logging.getLogger(__name__)


def dequantized_values(tensor: GgufTensor) -> np.ndarray:
    """The tensor's values as fp32, by gguf-py's reference dequantization (dense types widened)."""
    import gguf

    data = tensor.data.numpy()
    if tensor.type_name == "F32":
        return np.asarray(data, dtype=np.float32)
    if tensor.type_name in ("F16", "BF16"):
        return tensor.data.float().numpy()
    return np.asarray(gguf.quants.dequantize(data, gguf.GGMLQuantizationType[tensor.type_name]), dtype=np.float32)


def load_dequantized(path: Path | str, with_tokenizer: bool = True) -> tuple[nn.Module, object]:
    """(model, tokenizer): the fp32 causal LM holding ``path``'s weights, dequantized, in eval
    mode on the CPU. Costs 4 bytes a weight (the default 1.5B target: ~7 GB)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    start = time.perf_counter()
    file, entry = metadata_cache.open_cached(Path(path))
    check_architecture(file)
    config = metadata_cache.config(file, entry, read_config)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    processor = TENSOR_PROCESSORS.get(file.architecture, TensorProcessor)(config=config.to_dict())
    sources = {hf: name for hf, name in _gguf_names(file, model).items() if name in file.tensors}
    if "lm_head.weight" not in sources and "token_embd.weight" in file.tensors:
        sources["lm_head.weight"] = "token_embd.weight"  # a tied head: the embedding's rows
    tied = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
    for hf_name, param in list(model.named_parameters(remove_duplicate=False)):
        if tied and hf_name == "lm_head.weight":
            continue  # the embedding's own tensor, tied again below
        source = sources.get(hf_name)
        if source is None:
            raise GgufError(f"{file.name} has no tensor for {hf_name} of the {file.architecture} model it describes")
        values = dequantized_values(file.tensors[source])
        values = np.asarray(processor.process(weights=values, name=source).weights, dtype=np.float32)
        if values.size != param.numel():
            raise GgufError(f"{file.name}: {source} has {values.size} values, {hf_name} needs {list(param.shape)}")
        _set_parameter(model, hf_name, torch.from_numpy(np.ascontiguousarray(values).reshape(param.shape)))
    if tied:
        model.lm_head.weight = model.get_input_embeddings().weight
    release_freed_memory()  # gguf-py's per-tensor temporaries
    tokenizer = metadata_cache.tokenizer(file, entry) if with_tokenizer else None
    log.info("%s: fp32 model of its dequantized weights in %.1fs", file.name, time.perf_counter() - start)
    return model.eval(), tokenizer
