"""How much memory a catalog entry needs: weights, KV cache, drafter and runtime (the formula).

Whether that fits a machine, and what to recommend, is ``engine.models.planning.fit``.

An estimate has four parts (bytes):

    weights    target parameters x bytes per parameter of the precision, less what need not stay
               resident (an untied input embedding memory-mapped on the CPU: STORED_PRECISION);
               "int8" is the engine's int8 target: every linear layer and the LM head int8 with
               fp32 row scales, the input embedding left at bf16 (int8_target_bytes); "int4"
               its int4 target, 5 bits per linear weight (int4_target_bytes); "int4" on a GPU
               or a Mac torch's int4 kernels, 5 bits per decoder weight with the LM head and
               input embedding at int8 (int4_device_bytes); "file" a GGUF variant's own
               tensors, memory-mapped, less the untied input embedding that lookups leave
               unread (engine.models.planning.variants.GgufVariant.resident_bytes)
    kv_cache   the target's K/V at ``context`` tokens: 2 x layers x kv_heads x head_dim x bytes
               per token, sliding-window layers holding at most their window; fp16 for a GGUF
               target on the CPU (engine.models.runners.gguf_runner.KV_DTYPE), else the activations' dtype
    drafter    a separate draft model: its weights (at ``drafter_weights``, by default what the
               loader's "auto" picks, engine.models.planning.drafter_choice: "int8" / "int4" are the
               engine's quantized drafters, linear layers int8 / int4 and the embedding and head
               left at bf16; a GGUF drafter file its resident bytes) and its
               own K/V cache (fp16 on the CPU where the compiled kernels run,
               ``drafter_kv_dtype_bytes``); a Gemma 4 assistant:
               weights only (it reads the target's K/V); MTP heads: inside the target (0);
               prompt lookup: 0
    overhead   the runtime (Python, torch, transformers, tokenizers), the activations of one
               prefill pass (a chunk of PREFILL_CHUNK prompt rows), the target's states a drafter
               made for it keeps from the prefill, the logits of a verification pass, and the
               CUDA context on a GPU

Kept prefixes: between requests the session keeps the caches of a few recent conversations
(engine.models.runners.prefix_reuse.RunnerPool, bounded by its KEPT_CACHE_BYTES beyond the one in use), so
that a follow-up prefills only its new tokens; one conversation needs what the estimate says.

The overhead constants are measured, not tuned per model: see ``RUNTIME_BYTES`` and
``TOKENIZER_BYTES_PER_TOKEN`` and the activation model in ``activation_bytes``; tests check the
whole estimate against the peak RSS of the real default pair (tests/engine/models/planning/test_memory_fit.py).

No torch here: the app runs this on the GUI thread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from engine.core.settings import PREFILL_CHUNK
from engine.models.planning.architecture import Architecture, estimate_params
from engine.models.planning.catalog import (
    FILE_PRECISION,
    MADE_FOR_TARGET_KINDS,
    CatalogEntry,
    canonical_precision,
    weight_bytes,
)
from engine.models.planning.drafter_choice import auto_drafter_weights, cpu_kernels_expected
from engine.models.planning.hardware import GB
from engine.models.planning.variants import GgufVariant

Device = Literal["gpu", "unified", "cpu"]
Fit = Literal["gpu", "unified", "cpu", "tight", "none"]
FIT_ORDER: dict[str, int] = {"gpu": 0, "unified": 1, "cpu": 2, "tight": 3, "none": 4}

# Resident memory of the runtime before any model: Python, torch, transformers and their shared
# libraries, plus the model objects. Measured on Linux x86-64 with torch 2.13 CPU and
# transformers 5.24: 246 MiB after the imports (168 anonymous + 78 of mapped libraries), ~40 MiB
# more once a model object exists.
RUNTIME_BYTES = 300 * 2**20
# A fast (Rust) tokenizer's parsed vocabulary and merges: 225 MiB for the two Qwen2.5 tokenizers
# (151,936 tokens each) measured here, ~780 bytes per vocabulary entry.
TOKENIZER_BYTES_PER_TOKEN = 780
# torch's CUDA context, cuBLAS workspaces and kernels: VRAM that no tensor accounts for.
CUDA_CONTEXT_BYTES = 600 * 2**20
# Headroom a fit keeps free, for the OS, other apps and allocator fragmentation: 10% of the
# device's budget, at least 0.5 GB. Below that a model still loads but the fit is "tight".
HEADROOM_FRACTION = 0.10
HEADROOM_MIN = GB // 2
# What is budgeted is memory that must stay resident: anonymous memory, and weights that every
# step reads. Clean file-backed pages read once or rarely are not: the OS drops them under
# pressure and reads them again. Two cases matter:
# - Converting weights while loading (fp32 from the stored bf16) reads each file
#   once. Those pages show in peak RSS (10,861 MiB loading the default pair in fp32, 9,770 MiB
#   once loaded) but need no memory of their own.
# - On the CPU in the stored dtype the checkpoint stays memory-mapped, and an untied input
#   embedding is read one row per token. Generating at 2k context, 598 of the default pair's
#   705 MiB of input embeddings never became resident (3,993 of 4,591 MiB of weights were).
# Checkpoints are stored in bf16 (the Hub's safetensors; the offline pair as converted).
STORED_PRECISION = "bf16"
# Longest verification pass the engine runs: k drafted tokens plus the target's own (k <= 8).
MAX_VERIFY_ROWS = 9
# Contexts tried, largest first, when recommending a context length.
CONTEXT_LADDER = (131072, 65536, 32768, 16384, 8192, 4096, 2048)
MIN_CONTEXT = 2048
DEFAULT_CONTEXT = 4096


# Keys per partial softmax in the CPU attention kernel (kChunk in causal_attention.h).
ATTENTION_KEY_CHUNK = 256

# Drafter kinds that read the target's transformers cache and hidden states, so that a GGUF
# target runs on transformers' runner next to them, not on GgufRunner.
TRANSFORMERS_CACHE_KINDS = ("mtp", "assistant")


def kv_dtype_bytes(precision: str, device: Device, transformers_cache: bool = False, cpu_kernels: bool | None = None) -> float:
    """Bytes per cached K/V element of a GGUF model's runner: fp16 where it runs on GgufRunner
    (a GGUF file on the CPU where the compiled kernels run, ``cpu_kernels``, None: this
    machine's guess; unless its drafter reads transformers' cache), else the activations'."""
    if cpu_kernels is None:
        cpu_kernels = cpu_kernels_expected()
    if canonical_precision(precision) == FILE_PRECISION and device == "cpu" and cpu_kernels and not transformers_cache:
        return 2.0
    return dtype_bytes(precision, device)


def drafter_kv_dtype_bytes(own_blocks: bool, quantized: bool, device: Device, activation_bytes: float,
                           cpu_kernels: bool | None = None) -> float:
    """Bytes per cached K/V element of a draft model on the CPU where the compiled kernels run:
    fp16 both on its own GGUF blocks (GgufRunner) and re-quantized to int8 / int4 (FusedRunner,
    DRAFTER_KV_DTYPE); elsewhere the activations' dtype."""
    if cpu_kernels is None:
        cpu_kernels = cpu_kernels_expected()
    if device == "cpu" and cpu_kernels and (own_blocks or quantized):
        return 2.0
    return activation_bytes


def dtype_bytes(precision: str, device: Device = "cpu") -> float:
    """Bytes per activation / K/V element. The engine's int8 target computes and caches in fp32
    (engine.quant.quantize.to_int8_target), and so does its int4 one on the CPU; on a GPU or a
    Mac an int4 model computes in 16 bits (torch's int4 kernels read bf16 on CUDA, fp16 on MPS)."""
    name = canonical_precision(precision)
    if name == "int4" and device != "cpu":
        return 2.0
    # A GGUF model (precision "file") computes in fp32 on the CPU (engine.gguf.loader).
    return 4.0 if name in ("fp32", "int8", "int4", FILE_PRECISION) else 2.0


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    drafter: int
    overhead: int
    conservative: bool = False

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.drafter + self.overhead

    def to_dict(self) -> dict[str, int]:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "drafter": self.drafter, "overhead": self.overhead}


# -- estimating ------------------------------------------------------------------------------


def activation_bytes(arch: Architecture, tokens: int, precision: str, device: Device, context: int | None = None) -> int:
    """Peak activations of one forward pass over ``tokens`` tokens, the last of ``context``
    cached ones (default: the pass holds them all).

    The peak is inside an MLP: gate and up projections and their product, T x intermediate each
    in the activation dtype (3a bytes per element), plus on the CPU in 16-bit mode the fp32
    output of the fast linear kernel before it is narrowed (4 more bytes); next to it the
    residual stream and its normalized copy (2a) and RMSNorm's fp32 upcast (4) per hidden unit.
    Attention on CPU and GPU uses fused SDPA kernels whose memory grows with T, not T^2.
    Measured for Qwen2.5-Coder-1.5B, bf16, CPU: 93 MiB at 1,020 tokens; this gives 99 MiB.

    A GGUF model on the CPU (precision "file", engine.models.runners.gguf_runner) holds more there: gate
    and up come out of one call as one [T, 2 x intermediate] fp32 tensor, next to SiLU(gate), the
    product, and the down projection's int8 copy of its input: 4a + 1 bytes per element, not 3a
    (at 2k tokens on the default target ~90 MiB more than the 3a model says). Its attention
    kernel keeps a partial softmax (head_dim + 2 fp32) per row, head and 256-key chunk of the
    cache before the pass (kernels/attention/attention_avx2.cpp), freed before the MLP runs: the
    larger of the two is the peak."""
    a = dtype_bytes(precision, device)
    inter = arch.intermediate_size or 4 * arch.hidden_size
    staging = 4 if device == "cpu" and a == 2 else 0
    gguf_cpu = canonical_precision(precision) == FILE_PRECISION and device == "cpu"
    mlp = 4 * a + 1 if gguf_cpu else 3 * a
    per_row_mlp = inter * (mlp + staging)
    if gguf_cpu and context is not None and arch.attention_heads:
        chunks = max(0, context - tokens) // ATTENTION_KEY_CHUNK
        per_row_mlp = max(per_row_mlp, arch.attention_heads * chunks * (arch.head_dim + 2) * 4)
    per_token = per_row_mlp + arch.hidden_size * (2 * a + 4)
    # Right after a prefill longer than the window, sliding layers still hold all of its K/V.
    transient_kv = arch.prefill_kv_bytes(tokens, a) - arch.kv_bytes(tokens, a)
    return int(tokens * per_token) + transient_kv


def resident_weight_bytes(params: int, arch: Architecture | None, precision: str, device: Device) -> int:
    """Weight bytes that must stay in memory (see STORED_PRECISION): all of them, except an
    untied input embedding memory-mapped on the CPU."""
    total = weight_bytes(params, precision)
    mapped = device == "cpu" and canonical_precision(precision) == STORED_PRECISION
    if mapped and arch is not None and not arch.tie_word_embeddings:
        total -= weight_bytes(arch.vocab_size * arch.hidden_size, precision)
    return total


def int8_target_bytes(params: int, arch: Architecture | None, device: Device) -> int:
    """Resident bytes of the engine's int8 target (engine/quant/quantize.py ``to_int8_target``): every
    linear layer, the LM head included, as int8 with one fp32 scale per output row (about
    4 / hidden_size bytes more per weight); the input embedding stays bf16, memory-mapped on the
    CPU (a lookup reads one row per token) and copied to a GPU; norms and biases are noise."""
    if arch is None:
        return weight_bytes(params, "int8")
    table = arch.vocab_size * arch.hidden_size
    tables = 1 if arch.tie_word_embeddings else 2
    linear = max(0, params - tables * table) + table  # decoder layers + the LM head
    total = math.ceil(linear * (1 + 4 / arch.hidden_size))
    if device != "cpu":
        total += weight_bytes(table, STORED_PRECISION)
    return total


INT4_BYTES_PER_WEIGHT = 5 / 8  # 4-bit codes + an fp16 scale and offset per 32 (quantize.Int4Linear)


def int4_target_bytes(params: int, arch: Architecture | None, device: Device) -> int:
    """Resident bytes of the engine's int4 target (engine/quant/quantize.py ``to_int4_target``): every
    linear layer, the LM head included, at half a byte per weight plus an fp16 scale and offset
    per 32 (5 bits in all); the input embedding as for int8."""
    if arch is None:
        return math.ceil(params * INT4_BYTES_PER_WEIGHT)
    table = arch.vocab_size * arch.hidden_size
    tables = 1 if arch.tie_word_embeddings else 2
    linear = max(0, params - tables * table) + table
    total = math.ceil(linear * INT4_BYTES_PER_WEIGHT)
    if device != "cpu":
        total += weight_bytes(table, STORED_PRECISION)
    return total


# torch's int4 kernels (kernels/int4pack, engine/quant/gpu_weights.py): half a byte of codes a
# weight, and a 16-bit scale and zero per 32 weights (4 bytes / 32): 5 bits. The packed tensors
# hold exactly that (tests/kernels/test_int4pack.py measures the CUDA / MPS layout through
# torch's meta kernels and the CPU one for real).
INT4PACK_BYTES_PER_WEIGHT = 0.5 + 4 / 32


def int4_device_bytes(params: int, arch: Architecture | None) -> int:
    """Resident bytes of an "int4" target on a GPU or a Mac (engine/quant/gpu_weights.py
    ``to_4bit_device_weights``): decoder linears at INT4PACK_BYTES_PER_WEIGHT; the LM head and
    the input embedding int8 with a 16-bit scale per row, one table for both when they are
    tied; norms and biases are noise. Parameters the decoder's shapes do not account for (Gemma
    4's per-layer embeddings, experts held as fused tensors rather than linear layers) stay at
    16 bits: the conversion only takes nn.Linear layers and the input embedding. (A GGUF file's
    6- and 8-bit tensors held at int8 add ~3 bits a weight on those: Q4_K_M's are ~11% of a
    1.5B model's decoder weights.)"""
    if arch is None:
        return math.ceil(params * INT4PACK_BYTES_PER_WEIGHT)
    table = arch.vocab_size * arch.hidden_size
    tables = 1 if arch.tie_word_embeddings else 2
    unshaped = params - estimate_params(arch)
    other = unshaped if unshaped > 0.05 * params else 0  # dense decoders match their shapes within 0.01%
    layers = max(0, params - other - tables * table)
    return math.ceil(layers * INT4PACK_BYTES_PER_WEIGHT + tables * table * (1 + 2 / arch.hidden_size) + 2 * other)


def quantized_drafter_bytes(params: int, arch: Architecture | None, weights: str, device: Device) -> int:
    """Resident bytes of the engine's int8 or int4 drafter (engine/quant/quantize.py): the decoder
    layers' linears as int8 with fp32 row scales, or int4 at 5 bits a weight (as the int4
    target's), the embedding and LM head left at bf16 (the head's rows are quantized only when a
    reduced head is used, which is smaller still)."""
    per_weight = 1.0 if weights == "int8" else INT4_BYTES_PER_WEIGHT
    if arch is None:
        return math.ceil(params * per_weight)
    table = arch.vocab_size * arch.hidden_size
    tables = 1 if arch.tie_word_embeddings else 2
    layers = max(0, params - tables * table)
    total = math.ceil(layers * per_weight) + weight_bytes(tables * table, STORED_PRECISION)
    if device == "cpu" and tables == 2:
        total -= weight_bytes(table, STORED_PRECISION)  # the input embedding stays memory-mapped
    return total


def auto_drafter_budget(precision: str, device: Device, cpu_kernels: bool | None = None) -> str:
    """The weights a draft model loaded at "auto" is held in next to a target at ``precision``
    (engine.models.loading.loader.drafter_weights, by the same rule), in the fit's names. ``cpu_kernels``:
    whether the quantized CPU kernels run (None: this machine's guess, without torch); without
    them the drafter takes the target's dtype, fp32 next to an fp32-computing target (exact,
    int8, int4 or a GGUF file on the CPU)."""
    if cpu_kernels is None:
        cpu_kernels = device == "cpu" and cpu_kernels_expected()
    on_cpu = device == "cpu"
    chosen = auto_drafter_weights(canonical_precision(precision), on_cpu, int8_kernel=on_cpu and cpu_kernels,
                                  int4_kernel=on_cpu and cpu_kernels)
    return chosen or ("fp32" if dtype_bytes(precision, device) == 4 else "bf16")


def _logits_bytes(vocab: int, precision: str, device: Device) -> int:
    # A verification pass returns k+1 rows of logits, upcast to fp32 for sampling.
    return int(MAX_VERIFY_ROWS * vocab * (dtype_bytes(precision, device) + 4))


def estimate_memory(entry: CatalogEntry, precision: str = "bf16", context: int = DEFAULT_CONTEXT, device: Device = "cpu",
                    drafter_weights: str | None = None, variant: GgufVariant | None = None,
                    drafter_variant: GgufVariant | None = None, cpu_kernels: bool | None = None) -> MemoryEstimate:
    """Bytes needed to run ``entry`` with its drafter at ``context`` tokens on ``device``.
    ``drafter_weights`` is the draft model's weight precision; None budgets what the loader's
    "auto" picks (``auto_drafter_budget``: int8 next to a 16-bit or fp32 target and int4 next to
    an int8 / int4 / GGUF one on a CPU where the quantized kernels run, ``cpu_kernels`` saying
    whether they do; the 4-bit drafter next to an "int4" target on a GPU or a Mac, its embedding
    and head left at 16 bits; else the target's dtype).

    Precision "file" runs a GGUF ``variant`` of the target (one of ``entry.variants``, or a local
    file's, engine.models.loading.gguf_sizes.local_variant) on its own quantized weights: the weights are
    the file's resident bytes (``GgufVariant.resident_bytes``), activations and K/V fp32. Its
    drafter is ``drafter_variant`` (a GGUF file) or the draft model's folder: either way held at
    ``drafter_weights``, int8 / int4 layers budgeted alike (a GGUF drafter's are re-quantized,
    engine.models.loading.gguf_drafter), any other choice as the file's resident bytes (it runs on its
    own blocks then)."""
    if context < 1:
        raise ValueError(f"context must be at least 1 token, not {context}")
    precision = canonical_precision(precision)
    if (precision == FILE_PRECISION) != (variant is not None):
        raise ValueError("precision 'file' needs the GGUF variant it runs, and a variant runs only at precision 'file'")
    a = dtype_bytes(precision, device)
    target = entry.target_arch
    if variant is not None:
        weights = variant.resident_bytes(target)
    elif precision == "int8":
        weights = int8_target_bytes(entry.target_params, target, device)
    elif precision == "int4" and device == "cpu":  # the engine's int4 target (a CPU kernel)
        weights = int4_target_bytes(entry.target_params, target, device)
    elif precision == "int4":  # torch's int4 kernels on a GPU or a Mac
        weights = int4_device_bytes(entry.target_params, target)
    else:
        weights = resident_weight_bytes(entry.target_params, target, precision, device)
    kv = target.kv_bytes(context, kv_dtype_bytes(precision, device, entry.drafter_kind in TRANSFORMERS_CACHE_KINDS, cpu_kernels))
    drafter_weights = drafter_weights or auto_drafter_budget(precision, device, cpu_kernels)

    drafter = 0
    drafter_arch = entry.drafter_arch
    pass_rows = min(context, PREFILL_CHUNK)
    activations = activation_bytes(target, pass_rows, precision, device, context)
    vocabularies = [target.vocab_size]
    if entry.drafter_kind == "draft_model":
        quantized = canonical_precision(drafter_weights) in ("int8", "int4")
        # A GGUF drafter's layers are re-quantized then (engine.models.loading.gguf_drafter): budgeted as a
        # folder's, where its parameter count is known; otherwise as the file it runs on.
        if drafter_variant is not None and not (quantized and entry.drafter_params):
            drafter = drafter_variant.resident_bytes(drafter_arch)
        elif quantized:
            drafter = quantized_drafter_bytes(entry.drafter_params, drafter_arch, canonical_precision(drafter_weights), device)
        else:
            drafter = resident_weight_bytes(entry.drafter_params, drafter_arch, drafter_weights, device)
        if drafter_arch is not None:
            own_blocks = drafter_variant is not None and not (quantized and entry.drafter_params)
            drafter += drafter_arch.kv_bytes(context, drafter_kv_dtype_bytes(own_blocks, quantized, device, a, cpu_kernels))
            # The drafter prefills the prompt after the target has, so the peaks don't add up.
            activations = max(activations, activation_bytes(drafter_arch, pass_rows, precision, device, context))
            vocabularies.append(drafter_arch.vocab_size)
    elif entry.drafter_kind == "assistant":
        drafter = entry.drafter_weight_bytes(precision if precision != FILE_PRECISION else STORED_PRECISION)
    elif entry.drafter_kind in MADE_FOR_TARGET_KINDS:
        quantized = device == "cpu" and canonical_precision(drafter_weights) in ("int8", "int4")
        drafter = made_for_target_bytes(entry, context, quantized)
    # The target's states a drafter reads are kept from the prompt's prefill until its first
    # proposal (engine.drafters.kept_states): every prompt row, one or a few layers wide.
    activations += kept_state_bytes(entry, context)

    overhead = activations + _logits_bytes(target.vocab_size, precision, device)
    if device == "gpu":
        overhead += CUDA_CONTEXT_BYTES  # the runtime itself lives in host RAM, not VRAM
    else:
        overhead += RUNTIME_BYTES + TOKENIZER_BYTES_PER_TOKEN * sum(vocabularies)
    return MemoryEstimate(weights=weights, kv_cache=kv, drafter=drafter, overhead=overhead, conservative=entry.conservative)



# Keys and values a made-for-target drafter's cache holds at first (engine.drafters.eagle3_layers
# DraftKV); it doubles when full.
DRAFT_KV_FIRST_CAPACITY = 64


def made_for_target_bytes(entry: CatalogEntry, context: int, quantized: bool) -> int:
    """An EAGLE-3 / DFlash drafter as the engine holds it (engine.drafters): its layers in fp32,
    their linears at int8 where the CPU kernels run (``quantized``); a token embedding it ships
    kept at its stored 16 bits; its own fp32 K/V, grown by doubling, for ``context`` tokens."""
    embedding = entry.drafter_embedding_params
    linears_per_weight = 1.0 if quantized else 4.0
    weights = math.ceil((entry.drafter_params - embedding) * linears_per_weight) + weight_bytes(embedding, STORED_PRECISION)
    arch = entry.drafter_arch
    if arch is None:
        return weights
    capacity = DRAFT_KV_FIRST_CAPACITY
    while capacity < context:
        capacity *= 2
    return weights + arch.kv_bytes(capacity, 4)


def kept_state_bytes(entry: CatalogEntry, context: int) -> int:
    """The target's hidden states its drafter reads, fp32, for ``context`` rows: the last
    layer's for MTP heads, three layers' for EAGLE-3, one per draft layer for DFlash; none for
    the others (a Gemma 4 assistant reads the last position's alone)."""
    if entry.drafter_kind == "mtp":
        layers = 1
    elif entry.drafter_kind == "eagle3":
        layers = 3
    elif entry.drafter_kind == "dflash":
        layers = entry.drafter_arch.num_layers if entry.drafter_arch else 1
    else:
        return 0
    return context * layers * entry.target_arch.hidden_size * 4


def human_bytes(n: int) -> str:
    return f"{n / GB:.1f} GB" if n >= GB // 10 else f"{math.ceil(n / 2**20)} MB"
