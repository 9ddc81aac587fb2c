"""Loading a model folder (safetensors + tokenizer) at the precision a mode asks for."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core.heap import release_freed_memory
from engine.core.settings import Precision, precision_name
from engine.gguf import is_gguf
from engine.models.loading.cached_quantization import quantize_through_cache
from engine.models.loading.placement import check_fits, dtype_for, pick_device, weights_name  # noqa: F401  (pick_device, dtype_for: re-exported)
from engine.models.planning.drafter_choice import auto_drafter_weights
from engine.models.runners.fast_linear import accelerate_linears
from engine.models.runners.invariant_attention import use_batch_invariant_attention
from engine.quant.gpu_weights import to_4bit_device_weights
from engine.quant.quantize import int4_available, int8_available
from kernels import int4pack

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """``weights`` says how the weights are held: "bf16", "fp32", "fp16" or "int8".
    ``from_cache``: int8 / int4 weights (a target's or a drafter's) came from
    engine.quant.weight_cache (not quantized now)."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    seconds: float
    weights: str = ""
    from_cache: bool = False
    #: A model from a GGUF file: how the file holds its weights ("Q4_K_M"); its embedding and LM
    #: head are the file's whatever ``weights`` its layers run at ("file", or a drafter's int8 / int4).
    quantization: str = ""
    #: The memory-mapped GgufFile a GGUF model computes from (engine.gguf.resident can lock it).
    gguf_file: object = None


class DamagedModelFiles(RuntimeError):
    """A model folder's files are missing, truncated or unreadable; the message names the file."""


# Any of these makes a folder's tokenizer loadable (fast tokenizer, SentencePiece, BPE / WordPiece vocab).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
_MAX_HEADER = 100 << 20  # safetensors' own limit on a header


def check_safetensors_file(file: Path) -> None:
    """Refuse a truncated or garbled safetensors file by its header alone (a few kB read):
    the header lists every tensor's byte range, so the file's size must be exactly what it
    describes. Loading such a file fails later with a SafetensorError that names no file."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little") if size >= 8 else -1
            if not 0 < n <= min(_MAX_HEADER, size - 8):
                raise ValueError(f"its header length field says {n} bytes")
            header = json.loads(f.read(n))
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise DamagedModelFiles(f"{file} is damaged (not a readable safetensors file: {exc}); download or convert the model"
                                f" again") from exc
    if 8 + n + end != size:
        raise DamagedModelFiles(f"{file} is truncated or damaged: its header describes {8 + n + end:,} bytes but the file"
                                f" has {size:,}; download or convert the model again")


def check_model_folder(path: Path, with_tokenizer: bool = True) -> None:
    """What can be checked in a model folder before loading it, in milliseconds: config.json,
    each safetensors file's size against its header, the shards an index names, and a
    tokenizer. Raises FileNotFoundError or DamagedModelFiles naming the file."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model folder (no config.json)")
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, AttributeError) as exc:
            raise DamagedModelFiles(f"{index} is damaged ({exc}); download the model again") from exc
        for shard in sorted(shards):
            if not (path / shard).exists():
                raise DamagedModelFiles(f"{path / shard} is missing ({index.name} lists it); download the model again")
    for file in sorted(path.glob("*.safetensors")):
        check_safetensors_file(file)
    if with_tokenizer and not any((path / name).exists() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{path / 'tokenizer.json'} is missing: {path.name} has no tokenizer (none of"
                                f" {', '.join(TOKENIZER_FILES)}); copy it from the model's repository")


def read_config(path: Path) -> dict:
    """A model folder's config.json as a dict (no transformers import)."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model folder (no config.json)")
    return json.loads((path / "config.json").read_text())


def load_model(path: Path, precision: Precision = "bf16", device: str = "auto", fast_kernels: bool = True,
               role: str = "target", weights: str | None = None, with_tokenizer: bool = True,
               check_memory: bool = True) -> LoadedModel:
    """Load a model folder. ``fast_kernels`` routes bf16 CPU linears through kernels.linear;
    ``role`` is "target" (batch-invariant kernels everywhere) or "drafter". ``weights``
    ("int8", "int4", "bf16", "fp32"; drafters only) overrides the dtype the precision mode implies.
    Precision "int8" / "int4" quantizes a target's linear layers (LM head included) on the first
    load and reads them from engine.quant.weight_cache afterwards; so do a drafter's int8 / int4
    ``weights`` (its LM head left out, in a file of its own). On CUDA / MPS "int4" holds the
    linear layers as torch's 4-bit weights instead (engine.quant.gpu_weights), converted on the
    device at every load (seconds there).
    Drafters that ship no tokenizer (Gemma 4 assistants) load with ``with_tokenizer=False``.
    ``check_memory``: on a GPU, refuse with ``placement.DoesNotFit`` when the model would not fit
    its free memory (the CPU is never checked)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    precision = precision_name(precision)
    if is_gguf(path) or precision == "file" and role == "target":
        return _load_gguf(path, precision, device, role, with_tokenizer, weights)
    check_model_folder(path, with_tokenizer)
    if weights is not None and role != "drafter":
        raise ValueError("only a drafter's weights may differ from the precision mode's")
    dev = pick_device(device)
    dtype = dtype_for(precision, dev)
    if check_memory and dev.type != "cpu":
        check_fits(path, None, dtype, dev, weights=weights_name(precision, dev) if role == "target" else None)
    device_int4 = dev.type != "cpu" and (precision if role == "target" else weights) == "int4"
    if device_int4:
        reason = int4pack.unsupported_reason(dev)
        if reason is not None:
            raise ValueError(f"precision int4 cannot run on {dev}: {reason}; choose fast or exact there")
        return _load_device_int4(path, dev, dtype_for("int4", dev), role, with_tokenizer)
    if precision in ("int8", "int4") and role == "target":
        if dev.type != "cpu":  # the engine's int8 kernels read host memory
            raise ValueError(f"precision {precision} runs on the CPU only; choose fast, exact or int4 on {dev.type}")
        weights = precision
    if weights in ("bf16", "fp32"):
        dtype = torch.bfloat16 if weights == "bf16" else torch.float32
    start = time.perf_counter()
    # int8 is quantized from the checkpoint's bf16 weights (loading fp32 first would only cost
    # time and memory: the values are the same). fp32 is widened after a memory-mapped 16-bit
    # load, one tensor at a time: loading straight to fp32 let transformers hold converted
    # copies side by side, a peak up to 1.5 GB over the fp32 weights on the 1.5B model.
    widen = dtype == torch.float32 and weights not in ("int8", "int4") and dev.type == "cpu"
    load_dtype = torch.bfloat16 if weights in ("int8", "int4") else ("auto" if widen else dtype)
    from safetensors import SafetensorError

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=load_dtype).to(dev).eval()
        if widen:
            model.float()
            release_freed_memory()
    except SafetensorError as exc:  # damaged past what the header check sees; its message names no file
        raise DamagedModelFiles(f"{path}: a weight file is unreadable ({exc}); download or convert the model again") from exc
    from_cache = False
    if weights in ("int8", "int4"):
        from_cache = quantize_through_cache(model, path, weights, role)
        dtype = torch.float32  # activations
        release_freed_memory()
    elif fast_kernels:
        accelerate_linears(model, batch_invariant=role == "target")
    if role == "target" and fast_kernels:
        use_batch_invariant_attention(model)  # with the linear kernels: verification == decoding, bit for bit
    tokenizer = AutoTokenizer.from_pretrained(path) if with_tokenizer else None
    seconds = time.perf_counter() - start
    held = weights or {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    log.info("loaded %s on %s, %s weights%s, in %.1fs", path.name, dev, held, " (cached)" if from_cache else "", seconds)
    return LoadedModel(path.name, model, tokenizer, dev, dtype, seconds, held, from_cache)


def _load_device_int4(path: Path, dev: torch.device, dtype: torch.dtype, role: str, with_tokenizer: bool) -> LoadedModel:
    """Load ``path`` on the host in its stored dtype (memory-mapped: no copy) and convert it
    layer by layer to 4-bit weights on ``dev`` computing in ``dtype``, so neither the device nor
    the host holds a converted 16-bit copy. A target's LM head and embedding become int8; a
    drafter's stay 16-bit (its reduced head reads the rows)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto").eval()
    to_4bit_device_weights(model, dev, tables="int8" if role == "target" else "keep", dtype=dtype)
    release_freed_memory()
    tokenizer = AutoTokenizer.from_pretrained(path) if with_tokenizer else None
    seconds = time.perf_counter() - start
    log.info("loaded %s on %s, int4 weights (torch's kernels), in %.1fs", path.name, dev, seconds)
    return LoadedModel(path.name, model, tokenizer, dev, dtype, seconds, "int4")


def _load_gguf(path: Path, precision: Precision, device: str, role: str, with_tokenizer: bool,
               weights: str | None = None) -> LoadedModel:
    """A GGUF file computes on its own quantized weights, memory-mapped (engine.gguf), on the
    CPU: precision "file" for a target. A drafter held at ``weights`` "int8" / "int4" gets its
    decoder layers re-quantized to Tandem's (engine.models.loading.gguf_drafter: a cheaper draft step;
    a drafter's weights never change the output); at any other ``weights`` it runs the file's."""
    from engine.gguf.loader import load_gguf

    if role == "target" and not is_gguf(path):
        raise ValueError(f"precision 'file' runs a GGUF file's own quantization, and {path.name} is not a .gguf file "
                         "(a model folder runs at fast, exact, int8 or int4)")
    if role == "target" and precision != "file":
        raise ValueError(f"{path.name} is a GGUF file: it runs at precision 'file' (its own quantization), not {precision!r}")
    if device not in ("auto", "cpu"):
        raise ValueError(f"{path.name}: GGUF models run on the CPU only, not on {device}")
    loaded = load_gguf(path, with_tokenizer)
    held, from_cache, seconds = "file", False, loaded.seconds
    if role == "target":
        use_batch_invariant_attention(loaded.model)  # with the batch-invariant GGUF linears
    elif weights in ("int8", "int4"):
        from engine.models.loading.gguf_drafter import requantize_layers

        start = time.perf_counter()
        held, from_cache = weights, requantize_layers(loaded.model, loaded.file, weights)
        seconds += time.perf_counter() - start
    return LoadedModel(path.name, loaded.model, loaded.tokenizer, torch.device("cpu"), torch.float32, seconds,
                       held, from_cache, loaded.quantization, loaded.file)


def drafter_weights(requested: str, precision: Precision, device: str = "auto") -> str:
    """Resolve a drafter precision choice: "auto" is int8 where the fast int8 kernel runs, and
    int4 next to an int8 / int4 / GGUF ("file") target where the int4 kernel runs too.

    Why int4 there: a quantized target's one-token step is 2-4x cheaper than bf16's, so the
    drafter's step becomes a large share of each pass (c ~0.3 with int8). The int4 drafter reads
    ~60% of the bytes (default pair, one step 9.8 vs 14.7 ms); it agrees with the target a little
    less often, but on the int8 target it won on every category of the bench in the same run
    (2026-11-30 bench, repeats 2: code 1.55x vs 1.28x, prose 1.10x vs 0.97x, qa 1.19x vs 0.89x). Next to
    a bf16 target (c ~0.13 with int8) its lower acceptance would cost more than it saves.
    A GGUF target (precision "file", 4-6 bit blocks) is as cheap a step as an int4 one: its
    int4 drafter step cost 0.33 target steps where int8's cost 0.41 and the drafter's own Q5_0
    file 0.67 (2026-12-01, scripts/gguf_speculation_bench.py, 1 thread, the same run)."""
    if requested != "auto":
        return requested
    dev = pick_device(device)
    on_cpu = dev.type == "cpu"
    # The rule itself is torch-free (engine.models.planning.drafter_choice): the memory fit budgets by it.
    chosen = auto_drafter_weights(precision, on_cpu, int8_kernel=on_cpu and int8_available(),
                                  int4_kernel=on_cpu and int4_available(),
                                  int4pack=int4pack.unsupported_reason(dev) is None)
    return chosen or {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype_for(precision, dev)]


def same_vocabulary(target_tokenizer, drafter_tokenizer) -> bool:
    """A draft model must map ids to the same strings as the target (same tokenizer)."""
    return target_tokenizer.get_vocab() == drafter_tokenizer.get_vocab()
