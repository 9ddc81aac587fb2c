"""A GGUF header's numbers, checked against each other and against the tensors it lists.

Everything downstream sizes itself from the header: transformers builds a config of
``<arch>.block_count`` layers (20,000 of them take minutes and gigabytes before the first
missing tensor is noticed), the picker budgets memory from the same numbers, the rotary
embedding takes ``rope.freq_base`` as given (NaN decodes garbage), the tokenizer indexes its
vocabulary with ``bos/eos/pad`` ids. So the header is held to what the file itself shows, as
llama.cpp's loader holds it (each of ``blk.0`` .. ``blk.{n-1}`` present and no other; tensor
shapes as the numbers say), before anything is built from it:

    floats        every number in the metadata finite (token scores, per-token data, aside)
    counts        the architecture's layer, width, head and context numbers whole and >= 1,
                  within what a model can have
    layers        ``block_count`` = the layers whose tensors (``blk.N.*``) the file holds
    widths        ``embedding_length`` = the width of ``token_embd``; for the architectures
                  Tandem runs, head counts and sizes as ``attn_q`` / ``attn_k`` / ``attn_v``
                  hold them, ``feed_forward_length`` as ``ffn_up`` does
    token ids     the special tokens the tokenizer looks up (bos, eos, unknown, padding)
                  inside the vocabulary

``check_header`` raises the first problem as one ``GgufError`` line naming the file and the
key. It reads only the parsed metadata and the tensor table (names and shapes): milliseconds,
nothing allocated. engine.gguf.header runs it on every header it reads (the loader's, the
model library's listings and picker rows alike), engine.gguf.metadata_cache on headers it
kept from before.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from engine.gguf.header import GgufError

# The architectures Tandem computes (engine.gguf.model's; here, because this module must not
# bring torch). Their attention and feed-forward tensors are checked too.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
# Far above any real model (the largest have a few hundred layers, widths of tens of thousands,
# context windows of 10M tokens), far below what would exhaust memory if believed.
LIMITS = {"block_count": 4096, "embedding_length": 1 << 17, "context_length": 1 << 26, "feed_forward_length": 1 << 20,
          "attention.head_count": 1 << 12, "attention.head_count_kv": 1 << 12, "attention.key_length": 1 << 14,
          "attention.value_length": 1 << 14, "vocab_size": 1 << 24}
# These every model has, as one number >= 1; the others an architecture without attention
# (Mamba, RWKV) writes as 0, so they must be >= 1 only where Tandem computes the model, and
# some architectures write per layer, as arrays.
_NEVER_ZERO = ("block_count", "embedding_length", "context_length")
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
_LAYER = re.compile(r"^blk\.(\d+)\.")


def check_header(name: str, metadata: Mapping[str, object], shapes: Mapping[str, Sequence[int]]) -> None:
    """Raise ``GgufError`` for the first number of ``metadata`` that is not finite, out of range
    or contradicted by the tensors (``shapes``: tensor name -> shape in PyTorch order)."""
    _check_floats(name, metadata)
    arch = metadata.get("general.architecture")
    if isinstance(arch, str):
        counts = _check_counts(name, arch, metadata)
        _check_layers(name, arch, counts, shapes)
        _check_widths(name, arch, counts, shapes)
    _check_token_ids(name, metadata)


def _error(name: str, key: str, problem: str) -> GgufError:
    return GgufError(f"{name}: metadata '{key}' {problem}; the file is corrupted or was written wrong")


def _check_floats(name: str, metadata: Mapping[str, object]) -> None:
    for key, value in metadata.items():
        if key.startswith("tokenizer."):
            continue  # per-token data (scores), the tokenizer's own
        values = value if isinstance(value, list) else (value,)
        for item in values:
            if isinstance(item, float) and not math.isfinite(item):
                raise _error(name, key, f"is {item}, not a finite number")
    full = f"{metadata.get('general.architecture')}.rope.freq_base"
    value = metadata.get(full)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
        raise _error(name, full, f"is {value}; it must be above 0")


def _check_counts(name: str, arch: str, metadata: Mapping[str, object]) -> dict[str, int]:
    """The architecture's counts present in the metadata, each whole and within ``LIMITS`` (a
    per-layer array: each item >= 0, as llama.cpp's files list 0 for layers without one).
    Returns those that are single numbers above 0."""
    counts = {}
    computed = arch in SUPPORTED_ARCHITECTURES
    for key, limit in LIMITS.items():
        full = f"{arch}.{key}"
        if full not in metadata:
            continue
        value = metadata[full]
        if isinstance(value, list) and key not in _NEVER_ZERO:
            if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= limit for v in value):
                raise _error(name, full, f"is {_short(value)}; each must be a whole number from 0 to {limit:,}")
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise _error(name, full, f"is {_short(value)}, not a whole number")
        least = 1 if computed or key in _NEVER_ZERO else 0
        if key == "block_count":
            limit = value  # held to the layers present instead, where they can be counted
        if not least <= value <= limit:
            raise _error(name, full, f"is {value:,}; it must be from {least} to {limit:,}")
        if value:
            counts[key] = value
    return counts


def _check_layers(name: str, arch: str, counts: Mapping[str, int], shapes: Mapping[str, Sequence[int]]) -> None:
    """``block_count`` is the number of layers the file holds tensors for, numbered from 0."""
    layers = {int(m.group(1)) for t in shapes if (m := _LAYER.match(t))}
    blocks = counts.get("block_count")
    if blocks is None:
        return
    if not layers and arch not in SUPPORTED_ARCHITECTURES:  # layers named otherwise (T5's enc.blk.N)
        if blocks > LIMITS["block_count"]:
            raise _error(name, f"{arch}.block_count", f"is {blocks:,}; it must be from 1 to {LIMITS['block_count']:,}")
        return
    if len(layers) != blocks or (layers and max(layers) != blocks - 1):
        held = f"{len(layers):,} (blk.{min(layers)} to blk.{max(layers)})" if layers else "none"
        raise _error(name, f"{arch}.block_count", f"says {blocks:,} layers, but the file holds tensors for {held}")


def _check_widths(name: str, arch: str, counts: Mapping[str, int], shapes: Mapping[str, Sequence[int]]) -> None:
    hidden = counts.get("embedding_length")
    embedding = shapes.get("token_embd.weight")
    if hidden is not None and embedding is not None and len(embedding) == 2 and embedding[1] != hidden:
        raise _error(name, f"{arch}.embedding_length", f"is {hidden:,}, but token_embd.weight holds rows of {embedding[1]:,}")
    if arch not in SUPPORTED_ARCHITECTURES or hidden is None:
        return
    heads, kv_heads = counts.get("attention.head_count"), counts.get("attention.head_count_kv")
    if heads is None:
        return
    key_length = counts.get("attention.key_length")
    if key_length is None:
        if hidden % heads:
            raise _error(name, f"{arch}.attention.head_count", f"is {heads:,}, which does not divide the width {hidden:,}")
        key_length = hidden // heads
    value_length = counts.get("attention.value_length", key_length)
    _check_rows(name, arch, shapes, "attn_q", heads * key_length, "attention.head_count", hidden)
    if kv_heads is not None and heads % kv_heads:
        raise _error(name, f"{arch}.attention.head_count_kv", f"is {kv_heads:,}, which does not divide the "
                                                             f"{heads:,} attention heads")
    kv_heads = kv_heads or heads
    _check_rows(name, arch, shapes, "attn_k", kv_heads * key_length, "attention.head_count_kv", hidden)
    _check_rows(name, arch, shapes, "attn_v", kv_heads * value_length, "attention.head_count_kv", hidden)
    _check_rows(name, arch, shapes, "ffn_up", counts.get("feed_forward_length"), "feed_forward_length", hidden)


def _check_rows(name: str, arch: str, shapes: Mapping[str, Sequence[int]], tensor: str, rows: int | None, key: str,
                hidden: int) -> None:
    """Layer 0's ``tensor`` matrix is [rows, hidden], as the header's numbers make it."""
    shape = shapes.get(f"blk.0.{tensor}.weight")
    if rows is None or shape is None or len(shape) != 2:
        return
    if shape[0] != rows:
        raise _error(name, f"{arch}.{key}", f"does not match blk.0.{tensor}.weight: it has {shape[0]:,} rows, "
                                           f"the header's numbers give {rows:,}")
    if shape[1] != hidden:
        raise _error(name, f"{arch}.embedding_length", f"is {hidden:,}, but blk.0.{tensor}.weight takes "
                                                      f"inputs of {shape[1]:,}")


def _check_token_ids(name: str, metadata: Mapping[str, object]) -> None:
    tokens = metadata.get("tokenizer.ggml.tokens")
    length = getattr(tokens, "length", None)
    vocabulary = length if length is not None else len(tokens) if isinstance(tokens, list) else None
    if vocabulary is None:
        return
    for key in TOKEN_ID_KEYS:
        full = f"tokenizer.ggml.{key}"
        if full not in metadata:
            continue
        value = metadata[full]
        if not isinstance(value, int) or isinstance(value, bool):
            raise _error(name, full, f"is {_short(value)}, not a token id")
        if not 0 <= value < vocabulary:
            raise _error(name, full, f"is {value:,}, outside the vocabulary of {vocabulary:,} tokens")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
