"""GGUF variants of a catalog model: which quantized files exist for it, where, and how big.

A catalog model (resources/catalog.json, "models") may list ``"gguf"`` records, one per
quantization::

    {"quant": "Q4_K_M", "repo": "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF",
     "files": ["Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf"], "file_bytes": 4683073952,
     "size_source": "computed", "hub_listed": "4.68 GB"}

``files`` holds every part of a split model, in order. ``file_bytes`` is the sum over the parts.
``size_source`` says where that number comes from: "hub" (the Hub's exact byte count), "computed"
(from the architecture and llama.cpp's quantization recipe, ``recipe_file_bytes``: the Hub
was not reachable when the catalog was written, and the download checks the Hub's own size
anyway) or "file" (measured on a real copy of the file: the offline default pair's, or a file on
this machine read by ``local_variant``). ``hub_listed`` is
the rounded size the Hub's file listing shows, kept so a test can check the computed figure.

A model with no GGUF variant is offered as safetensors (``SAFETENSORS``), at the engine's own
precisions (bf16 / fp32 / int8 / int4).

No torch here (the app reads the catalog on the GUI thread); ``local_variant``
(engine.models.loading.gguf_sizes) opens a file with engine.gguf, on a worker.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # only for annotations: no import cycle with the catalog
    from engine.models.planning.architecture import Architecture

SizeSource = Literal["hub", "computed", "file"]
SIZE_SOURCES = ("hub", "computed", "file")
# The quantizations the catalog lists (llama.cpp's names). The recipe below knows these three.
QUANTS = ("Q4_K_M", "Q5_K_M", "Q8_0")
# What a FitResult names as its variant when the model runs from safetensors instead.
SAFETENSORS = "safetensors"
# Where a GGUF target runs today: engine.gguf computes on the file's quantized rows on the CPU
# (engine.models.loading.loader refuses another device). On a GPU or a Mac the safetensors model runs.
GGUF_DEVICES = ("cpu",)


class VariantError(ValueError):
    """A "gguf" record of the catalog is malformed (the message names the model)."""


@dataclass(frozen=True)
class GgufVariant:
    """One quantized GGUF build of a model: ``files`` in ``repo`` (every part of a split model),
    ``file_bytes`` their total size (see the module docstring for ``size_source``)."""

    quant: str
    repo: str
    files: tuple[str, ...]
    file_bytes: int
    size_source: SizeSource = "computed"
    hub_listed: str | None = None
    #: From a file's header (``local_variant``): its tensor bytes, and those of an input
    #: embedding that a separate output matrix leaves to row-by-row lookups. None for a catalog
    #: variant: ``resident_bytes`` estimates them from the architecture.
    tensor_bytes: int | None = None
    embedding_bytes: int | None = None

    @property
    def split(self) -> bool:
        return len(self.files) > 1

    def resident_bytes(self, arch: "Architecture | None") -> int:
        """Weight bytes that stay in memory while this file generates on the CPU: its tensors
        (memory-mapped, every matrix read each token), less an untied input embedding, which a
        lookup reads one row per token (GgufEmbedding): generating at 2k context, the default
        target's file had 983.4 MB of its 1,111.4 MB of tensors resident, i.e. all but 3.3 MB
        of its 131.3 MB Q4_K embedding unread (EMBEDDING_RESIDENT_FRACTION;
        tests/engine/models/planning/test_memory_fit.py checks the whole estimate against such a run)."""
        header = math.ceil(HEADER_BYTES_PER_TOKEN * arch.vocab_size) if arch is not None else 0
        tensors = self.tensor_bytes if self.tensor_bytes is not None else max(0, self.file_bytes - header)
        embedding = self.embedding_bytes
        if embedding is None:
            embedding = recipe_embedding_bytes(arch, self.quant) if arch is not None else 0
        return tensors - int(embedding * (1 - EMBEDDING_RESIDENT_FRACTION))

    def to_dict(self) -> dict:
        return {"quant": self.quant, "repo": self.repo, "files": list(self.files), "file_bytes": self.file_bytes,
                "size_source": self.size_source}


def parse_variants(records: object, where: str) -> tuple[GgufVariant, ...]:
    """The ``"gguf"`` list of a catalog model, checked; ``where`` names the model in errors."""
    if records is None:
        return ()
    if not isinstance(records, list):
        raise VariantError(f"catalog {where}: 'gguf' must be a list of variants, not {type(records).__name__}")
    variants, seen = [], set()
    for i, record in enumerate(records):
        at = f"{where} gguf[{i}]"
        if not isinstance(record, dict):
            raise VariantError(f"catalog {at}: a variant is an object with quant, repo, files, file_bytes")
        unknown = sorted(set(record) - {"quant", "repo", "files", "file_bytes", "size_source", "hub_listed", "note"})
        if unknown:
            raise VariantError(f"catalog {at}: unknown field(s) {', '.join(unknown)}")
        quant, repo, files, size = (record.get(k) for k in ("quant", "repo", "files", "file_bytes"))
        if not isinstance(quant, str) or not quant:
            raise VariantError(f"catalog {at}: 'quant' must be a quantization name like 'Q4_K_M', not {quant!r}")
        if not isinstance(repo, str) or repo.count("/") != 1:
            raise VariantError(f"catalog {at} ({quant}): 'repo' must be a Hub repo 'owner/name', not {repo!r}")
        if not isinstance(files, list) or not files or not all(isinstance(f, str) and f.endswith(".gguf") for f in files):
            raise VariantError(f"catalog {at} ({quant}): 'files' must list the .gguf file(s), not {files!r}")
        if len(files) > 1 and not all(f"-{n:05d}-of-{len(files):05d}.gguf" in f for n, f in enumerate(files, 1)):
            raise VariantError(f"catalog {at} ({quant}): split files must be named -0000N-of-{len(files):05d}.gguf, in order")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise VariantError(f"catalog {at} ({quant}): 'file_bytes' must be a positive whole number of bytes, not {size!r}")
        source = record.get("size_source", "computed")
        if source not in SIZE_SOURCES:
            raise VariantError(f"catalog {at} ({quant}): 'size_source' must be one of {', '.join(SIZE_SOURCES)}, not {source!r}")
        if quant.upper() in seen:
            raise VariantError(f"catalog {at}: {quant} is listed twice")
        seen.add(quant.upper())
        variants.append(GgufVariant(quant, repo, tuple(files), size, source, record.get("hub_listed")))
    return tuple(variants)


def paired_drafter_variant(target: GgufVariant, drafters: tuple[GgufVariant, ...]) -> GgufVariant | None:
    """The drafter GGUF file that goes with the ``target`` file: the same quantization where one
    is listed, else the first listed (the catalog's choice); None when there is none. The download
    fetches this file, the app loads it and the memory fit budgets it (engine.hub.gguf_plan,
    app/picker/downloads.py, engine.models.planning.fit)."""
    for v in drafters:
        if v.quant.lower() == target.quant.lower():
            return v
    return drafters[0] if drafters else None


# -- sizes from the architecture (llama.cpp's quantization recipe) -----------------------------

# Bytes per block and weights per block of each GGUF type (gguf-py's GGML_QUANT_SIZES, written
# out here so reading the catalog imports no numpy).
BLOCK = {"F32": (1, 4), "F16": (1, 2), "Q4_0": (32, 18), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
         "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
# A K-quant needs rows that are a whole number of 256-weight super-blocks; llama.cpp falls back
# to these 32-weight types otherwise (e.g. the 896-wide Qwen2.5 0.5B).
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
# (base type, the type of "more bits" tensors, the type of the output / tied embedding)
_RECIPES = {"Q4_K_M": ("Q4_K", "Q6_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K", "Q6_K"), "Q8_0": ("Q8_0", "Q8_0", "Q8_0")}
# Header bytes (metadata, vocabulary, merges, tensor table) per vocabulary entry: 5,950,528
# bytes for the 151,936-token Qwen2.5 files here, i.e. 39.2.
HEADER_BYTES_PER_TOKEN = 39.2
# Share of an untied input embedding's pages that become resident while generating (rows of the
# prompt's and the output's tokens only): 2.5% measured at 2k context, see
# GgufVariant.resident_bytes.
EMBEDDING_RESIDENT_FRACTION = 0.03


def tensor_bytes(type_name: str, rows: int, row_length: int) -> int:
    """Bytes of a [rows, row_length] tensor stored as ``type_name`` (with the K-quant fallback)."""
    block, size = BLOCK[type_name]
    if row_length % block:
        type_name = _FALLBACK.get(type_name, type_name)
        block, size = BLOCK[type_name]
    return rows * math.ceil(row_length / block) * size


def _more_bits(i: int, n: int) -> bool:
    # llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def recipe_file_bytes(arch: "Architecture", quant: str) -> int:
    """The size of ``arch`` quantized by llama.cpp to ``quant`` (Q4_K_M, Q5_K_M, Q8_0): for the
    _M recipes the base K-quant everywhere, Q6_K for attn_v and ffn_down in the layers
    use_more_bits picks, and Q6_K for the output matrix (or the embedding of a tied model,
    which then serves as the output); Q8_0 everything; F32 norms and biases; plus the header.
    Dense decoders only (llama, qwen2, qwen3): their shapes fix every tensor. Checked against the
    real default-pair file (exact to 0.1%) and the Hub's listed sizes (tests/engine/models/planning/test_variants.py)."""
    if quant not in _RECIPES:
        raise ValueError(f"no size recipe for {quant}; known: {', '.join(_RECIPES)}")
    base, more, out_type = _RECIPES[quant]
    hidden, vocab, n = arch.hidden_size, arch.vocab_size, arch.num_layers
    heads = arch.attention_heads or hidden // arch.head_dim
    q_dim, kv_dim = heads * arch.head_dim, arch.kv_heads * arch.head_dim
    inter = arch.intermediate_size or 4 * hidden
    total = 0
    for i in range(n):
        more_bits = more if _more_bits(i, n) else base
        total += tensor_bytes(base, q_dim, hidden) + tensor_bytes(base, kv_dim, hidden)
        total += tensor_bytes(more_bits, kv_dim, hidden)  # attn_v
        total += tensor_bytes(base, hidden, q_dim)  # attn_output
        total += 2 * tensor_bytes(base, inter, hidden) + tensor_bytes(more_bits, hidden, inter)  # gate, up, down
        total += 4 * (2 * hidden)  # attention and FFN norms (F32)
        if arch.model_type == "qwen2":
            total += 4 * (q_dim + 2 * kv_dim)  # q/k/v biases (F32)
        if arch.model_type == "qwen3":
            total += 4 * (2 * arch.head_dim)  # q/k norms (F32)
    total += 4 * hidden  # output norm
    if arch.tie_word_embeddings:
        total += tensor_bytes(out_type, vocab, hidden)
    else:
        total += tensor_bytes(base, vocab, hidden) + tensor_bytes(out_type, vocab, hidden)
    return total + math.ceil(HEADER_BYTES_PER_TOKEN * vocab)


def recipe_embedding_bytes(arch: "Architecture", quant: str) -> int:
    """Bytes of the input embedding that a separate output matrix leaves to lookups (0 for a
    tied model, whose embedding is the output matrix, read whole every token)."""
    if arch.tie_word_embeddings or quant not in _RECIPES:
        return 0
    return tensor_bytes(_RECIPES[quant][0], arch.vocab_size, arch.hidden_size)

