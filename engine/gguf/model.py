"""Build the transformers model a GGUF file describes, computing on the file's own weights.

The config comes from the file's metadata through transformers' GGUF support; the model is
instantiated with empty (meta) parameters, then every linear layer becomes a GgufLinear over
the file's quantized rows, the embedding a GgufEmbedding (rows dequantized as looked up), and
the F32 norms and biases are views of the file. Nothing is dequantized as a whole and no bf16
or fp32 copy of the model exists at any point.

GGUF -> transformers tensor names are transformers' own map (``get_gguf_hf_weights_map``), and
so are the per-architecture corrections (its ``TENSOR_PROCESSORS``): llama's Q/K rows are
permuted for llama.cpp's rotary layout (undone here as a reordering of the layer's outputs, the
quantized rows untouched), Gemma stores norms as 1 + w.
"""
from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import torch
from torch import nn

from engine.gguf import hf_metadata
from engine.gguf.header_checks import SUPPORTED_ARCHITECTURES
from engine.gguf.reader import GgufError, GgufFile, GgufTensor
from kernels import gguf_linear

log = logging.getLogger(__name__)

_DENSE_TYPES = ("F32", "F16", "BF16")
# Metadata every supported architecture needs, under "<arch>.": without it no config can be made.
_REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")


def check_architecture(file: GgufFile) -> str:
    arch = file.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GgufError(f"{file.name} is a '{arch}' model; Tandem runs GGUF files of these architectures: "
                        f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    for key in _REQUIRED:
        file.require(f"{arch}.{key}")
    return arch


def read_config(file: GgufFile):
    """The transformers config of the model in ``file``: from the metadata engine.gguf read
    (engine.gguf.hf_metadata, milliseconds), else from transformers' own GGUF reader (~8 s for
    the default target: gguf-py re-reads the header)."""
    from transformers import AutoConfig

    arch = check_architecture(file)
    # All parts' tensors: the model is the whole split set (transformers looks at the first).
    config = hf_metadata.fast_or_transformers(
        lambda: hf_metadata.read_config(file.path, file.metadata, file.tensors),
        lambda: AutoConfig.from_pretrained(file.path.parent, gguf_file=file.path.name), file.name, "config")
    # transformers maps no head size for qwen3: its config's default (128) is wrong for any
    # Qwen3 whose heads are another size; the file says which.
    key_length = file.metadata.get(f"{arch}.attention.key_length")
    if key_length and hasattr(config, "head_dim") and config.head_dim != int(key_length):
        config.head_dim = int(key_length)
    return config


def check_tensor_types(file: GgufFile) -> None:
    """Refuse, before building anything, a file whose matrices the kernels cannot compute."""
    supported = {t.name for t in gguf_linear.SUPPORTED_TYPES}
    for tensor in file.tensors.values():
        if tensor.type_name not in supported and tensor.type_name not in _DENSE_TYPES:
            raise GgufError(f"{file.name}: tensor {tensor.name} is {tensor.type_name}, which Tandem cannot compute "
                            f"(it runs {', '.join(sorted(supported))} and F32 / F16 / BF16)")


def build_model(file: GgufFile, config) -> nn.Module:
    """The causal LM of ``config`` running on ``file``'s tensors (eval mode, CPU, fp32 activations)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    check_tensor_types(file)
    with init_empty_weights():  # parameters on the meta device; buffers (rotary) real
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    processor = TENSOR_PROCESSORS.get(file.architecture, TensorProcessor)(config=config.to_dict())
    sources = {hf: name for hf, name in _gguf_names(file, model).items() if name in file.tensors}
    if "lm_head.weight" not in sources and "token_embd.weight" in file.tensors:
        sources["lm_head.weight"] = "token_embd.weight"  # a tied head: the embedding's rows
    used: set[str] = set()
    linears = [sources[f"{name}.weight"] for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and f"{name}.weight" in sources]
    pack = _packed_copies_fit(file, linears)
    for module_name, module in list(model.named_modules()):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            source = sources.get(f"{module_name}.weight")
            if source is None:
                continue
            bias = sources.get(f"{module_name}.bias")
            replacement = _replace(file, processor, module, file.tensors[source], bias and file.tensors[bias], pack)
            _set_submodule(model, module_name, replacement)
            used.update({source} | ({bias} if bias else set()))
    for hf_name, param in list(model.named_parameters()):
        if param.device.type != "meta":
            continue
        source = sources.get(hf_name)
        if source is None:
            raise GgufError(f"{file.name} has no tensor for {hf_name} of the {file.architecture} model it describes")
        _set_parameter(model, hf_name, _dense(file, processor, file.tensors[source], tuple(param.shape)))
        used.add(source)
    if "rope_freqs.weight" in file.tensors:
        _apply_rope_factors(model, file.tensors["rope_freqs.weight"])
        used.add("rope_freqs.weight")
    unused = sorted(set(file.tensors) - used)
    if unused:
        log.info("%s: %d tensors not used by the model: %s", file.name, len(unused), ", ".join(unused[:8]))
    return model.eval()


def quantization(file: GgufFile) -> str:
    """How the file holds its weights, e.g. "Q4_K_M": the file-type metadata where its tensors
    bear it out, else "mostly Q5_0" (the matrices' commonest type). Some converters write a file
    type that does not match (the default drafter says Q4_K_M and holds mostly Q5_0)."""
    from gguf import LlamaFileType

    matrices = Counter(t.type_name for t in file.tensors.values() if len(t.shape) == 2)
    main = matrices.most_common(1)[0][0] if matrices else "F32"
    try:
        named = LlamaFileType(int(file.metadata["general.file_type"])).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, ValueError, TypeError):
        named = None
    if named and (named == main or named.startswith(main + "_")):
        return named
    return main if len(matrices) == 1 else f"mostly {main}"


def file_precision_label(file: GgufFile) -> str:
    """What the app shows for precision "file": "As in the file (Q4_K_M)"."""
    return f"As in the file ({quantization(file)})"


# -- pieces ------------------------------------------------------------------------------------


def _gguf_names(file: GgufFile, model: nn.Module) -> dict[str, str]:
    """{transformers parameter name: GGUF tensor name}, from gguf-py's name map for the file's
    architecture (the map transformers' ``get_gguf_hf_weights_map`` uses; that one rebuilds it
    for every submodule, ~11 s for a 28-layer model)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((k for k, v in MODEL_ARCH_NAMES.items() if v == file.architecture), None)
    if arch is None:
        raise GgufError(f"{file.name}: this gguf library has no tensor names for '{file.architecture}'")
    names = get_tensor_name_map(arch, model.config.num_hidden_layers)
    found = {}
    for hf_name in model.state_dict():
        base, dot, suffix = hf_name.rpartition(".")
        name = names.get_name(base)
        if name is None and "." in base:  # the map may know the decoder's own names ("layers.0...")
            name = names.get_name(base.split(".", 1)[1])
        if name is not None:
            found[hf_name] = f"{name}{dot}{suffix}"
    return found


def packed_copy_bytes(file: GgufFile, names) -> int:
    """At most what the CPU kernels' own layout of the matrices ``names`` takes (where the AVX2
    tiles or the VNNI tiles without AMX run, Q4_K and Q6_K: kernels.gguf_linear; 3% over the
    file's bytes of them); 0 where none of them is laid out again."""
    packed_types = {t.name for t in gguf_linear.packed_types()}
    return int(1.03 * sum(file.tensors[name].nbytes for name in set(names) if file.tensors[name].type_name in packed_types))


def _packed_copies_fit(file: GgufFile, linears: list[str]) -> bool:
    """Whether the kernels may hold their own layout of the matrices ``linears`` name. That copy is
    the process's own memory, which the OS cannot drop as it drops a mapped file's pages: where
    free memory does not hold it (a model larger than RAM, streamed from disk), the weights stay
    the file's mapped bytes."""
    needed = packed_copy_bytes(file, linears)
    if not needed:
        return False
    import psutil

    from engine.gguf.resident import COPY_HEADROOM

    # The file's pages in the page cache count as available, and each is released once its
    # matrix is copied: what must fit is the copy.
    available = psutil.virtual_memory().available
    if needed + COPY_HEADROOM <= available:
        return True
    log.warning("%s: the CPU kernels' own layout of its weights needs %.0f MiB and %.0f MiB is free: "
                "computing from the mapped file instead (slower on this CPU)", file.name, needed / 2**20,
                available / 2**20)
    return False


def _replace(file: GgufFile, processor, module: nn.Module, weight: GgufTensor, bias: GgufTensor | None,
             pack: bool = False) -> nn.Module:
    from engine.gguf.modules import DenseLinear, GgufEmbedding, GgufLinear

    if isinstance(module, nn.Embedding):
        expected = (module.num_embeddings, module.embedding_dim)
        _check_shape(file, weight, expected)
        scale = getattr(module, "embed_scale", None)  # Gemma: embeddings times sqrt(hidden)
        return GgufEmbedding(weight.data, weight.type_name, *expected, scale=None if scale is None else float(scale))
    expected = (module.out_features, module.in_features)
    _check_shape(file, weight, expected)
    order = _row_order(file, processor, weight)
    bias_values = None
    if bias is not None:
        bias_values = _dense(file, processor, bias, (module.out_features,))
    if not weight.quantized:
        return DenseLinear(_dense(file, processor, weight, expected), bias_values)
    qtype = gguf_linear.T[weight.type_name]
    linear = GgufLinear(weight.data, qtype, *expected, bias=bias_values, out_order=order, pack=pack)
    if linear.weight_blocks.packed is not None:
        # The tiles read the copy laid out for them (kernels.gguf_linear); the file's pages of
        # this matrix were read once to make it and are wanted again only for a row or two.
        file.release_pages(weight.data)
    return linear


def _row_order(file: GgufFile, processor, weight: GgufTensor) -> torch.Tensor | None:
    """The row permutation transformers' processor applies to ``weight`` (None: none), found by
    running it on the row numbers. Anything but a permutation of rows cannot be applied to
    quantized blocks."""
    rows = weight.shape[0]
    probe = np.arange(rows, dtype=np.float64)[:, None]
    out = np.asarray(processor.process(weights=probe, name=weight.name).weights).reshape(rows, -1)
    if out.shape != (rows, 1) or not np.array_equal(np.sort(out[:, 0]), probe[:, 0]):
        raise GgufError(f"{file.name}: the {file.architecture} model changes tensor {weight.name} in a way that "
                        "cannot be applied to quantized weights")
    if np.array_equal(out[:, 0], probe[:, 0]):
        return None
    return torch.from_numpy(out[:, 0].astype(np.int64))


def _dense(file: GgufFile, processor, tensor: GgufTensor, expected: tuple[int, ...]) -> torch.Tensor:
    """A float tensor of the file (F32 stays a view of it), after the architecture's correction."""
    if tensor.quantized:
        raise GgufError(f"{file.name}: {tensor.name} is {tensor.type_name}; Tandem expects it as F32/F16/BF16")
    data = tensor.data if tensor.type_name == "F32" else tensor.data.float()
    array = data.numpy()
    processed = np.asarray(processor.process(weights=array, name=tensor.name).weights)
    result = data if processed is array else torch.from_numpy(np.ascontiguousarray(processed, dtype=np.float32))
    if tuple(result.shape) != expected:
        if result.numel() != int(np.prod(expected)):
            raise GgufError(f"{file.name}: {tensor.name} has shape {list(result.shape)}, the model needs {list(expected)}")
        result = result.reshape(expected)
    return result


def _check_shape(file: GgufFile, tensor: GgufTensor, expected: tuple[int, int]) -> None:
    if tuple(tensor.shape) != expected:
        raise GgufError(f"{file.name}: {tensor.name} has shape {list(tensor.shape)}, the model described by its "
                        f"metadata needs {list(expected)}")


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def _set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent), leaf, nn.Parameter(value, requires_grad=False))


def _apply_rope_factors(model: nn.Module, factors: GgufTensor) -> None:
    """Llama 3.x files carry their rope scaling as per-frequency divisors (``rope_freqs``),
    which llama.cpp applies to the base frequencies; transformers' GGUF config knows no rope
    scaling, so the divisors go into the rotary embedding's frequencies here."""
    values = factors.data.float()
    for module in model.modules():
        inv_freq = getattr(module, "inv_freq", None)
        if isinstance(inv_freq, torch.Tensor) and inv_freq.shape == values.shape:
            module.inv_freq = inv_freq / values
            if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
                module.original_inv_freq = module.inv_freq.clone()
