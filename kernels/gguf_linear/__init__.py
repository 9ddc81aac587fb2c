"""Linear layers on a GGUF file's own quantized weights (Q4_0 .. Q8_0, Q4_K, Q5_K, Q6_K).

Why: a GGUF model runs from the bytes in its file, memory-mapped, with no conversion at load
and no second copy: the weights stay at 4.5-8.5 bits, and llama.cpp's recipe (inputs quantized
to int8 per block, integer products, fp32 work per super-block) keeps a decode step bound by
memory and a verification block cheap. reference.py is the specification; blocks.py decodes
the formats (``dequantize`` is bit-identical to gguf-py's numpy one).

    w = prepare(raw, qtype, n, k)          # raw: uint8 [N, row_bytes], e.g. a GGUFReader tensor
    y = linear(x, w, bias)                 # x [..., K] -> [..., N]
    rows = dequantize(raw[ids], qtype, len(ids), k)   # embedding rows, fp32

The backend is chosen once, on first use (the compiled one is built then); ``use_backend(name)``
overrides it (tests, benchmarks). A type the compiled backend does not cover runs on the
reference.

One exception to "no second copy": ``prepare`` lays Q4_K and Q6_K out again where the AVX2
tiles run (CPUs without AVX-512 VNNI: groups of 8 rows, gguf_rows8_avx2.h, 103% and 100% of the
bytes) and where the VNNI tiles run without AMX (groups of 16 rows, gguf_rows16_vnni.h, 103% and
101%): on the file's layout those tiles are bound by their arithmetic, the AVX2 ones' Q4_K at
about half the memory's rate, the VNNI ones' from a second input row on (a verification's extra
rows cost ~6 ms each in the default target's step). Where AMX tiles run the file's rows stay
what every tile reads.
The file's pages of such a weight are then read only for embedding rows (``release_pages`` of
the model's file lets them go).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from kernels.backends import CpuBackends, package_api
from kernels.gguf_linear import reference
from kernels.gguf_linear.blocks import SUPPORTED_TYPES, T, check_raw, dequantize

backends = CpuBackends("gguf_linear", reference, "gguf linear", isa="gguf_isa")
available_backends, active_backend, fast_backend, use_backend = package_api(__name__)


@dataclass(frozen=True, eq=False)
class GgufWeight:
    """One [N, K] weight in GGUF's block layout, as the file holds it: ``raw`` [N, row_bytes]
    uint8 is the file's own bytes where they came in contiguous (a memory-mapped tensor stays
    mapped: nothing is copied). ``packed``: the same weight laid out for the tiles in use where
    they have a layout of their own (see the module's docstring), else None."""

    raw: torch.Tensor
    qtype: T
    n: int
    k: int
    packed: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.raw.numel()


def prepare(raw: torch.Tensor, qtype, n: int, k: int, pack: bool = True) -> GgufWeight:
    """raw uint8 [N, row_bytes] (a GGUF tensor's data: a torch tensor, or the numpy memmap
    gguf.GGUFReader gives, shared, not copied) -> the weight ``linear`` takes. ``pack``: allow
    the tiles in use their own layout of it (a copy in memory, see the module's docstring)."""
    if not isinstance(raw, torch.Tensor):
        with warnings.catch_warnings():
            # A read-only memmap: nothing here ever writes to the weights.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            raw = torch.as_tensor(raw)
    if raw.dim() == 1:  # a flat buffer of n rows
        raw = raw.reshape(n, -1)
    check_raw(raw, qtype, n, k)
    raw = raw if raw.is_contiguous() else raw.contiguous()
    fast = fast_backend()
    packed = fast.pack(raw, T(qtype), int(n), int(k)) if pack and fast is not None and hasattr(fast, "pack") else None
    return GgufWeight(raw, T(qtype), int(n), int(k), packed)


def linear(x: torch.Tensor, w: GgufWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) with x quantized per block as reference.py specifies; x [..., K] fp32
    (or bf16) -> [..., N] in x's dtype."""
    if x.shape[-1] != w.k:
        raise ValueError(f"input width {x.shape[-1]} does not match the weight's {w.k}")
    fast = fast_backend()
    if fast is not None and w.qtype in fast.TYPES:
        return fast.linear(x, w, bias)
    return reference.linear(x, w.raw, w.qtype, w.n, w.k, bias)


def linear_group(x: torch.Tensor, weights, biases=None) -> torch.Tensor:
    """[..., sum N]: ``linear(x, w, b)`` of several weights of the same width side by side, bit
    for bit ``torch.cat([linear(x, w, b) ...], -1)``, in one call: the compiled backend quantizes
    x once per block layout and shares all the weights' tiles out in one parallel region (a
    layer's q, k, v or gate, up: fewer thread wake-ups and calls in a decode step)."""
    weights = list(weights)
    biases = [None] * len(weights) if biases is None else list(biases)
    if not weights or len(biases) != len(weights):
        raise ValueError("linear_group needs one or more weights, and a bias (or None) for each")
    if any(w.k != x.shape[-1] for w in weights):
        raise ValueError(f"input width {x.shape[-1]} does not match every weight's ({[w.k for w in weights]})")
    fast = fast_backend()
    if fast is not None and hasattr(fast, "linear_group") and len(weights) <= 8 and all(w.qtype in fast.TYPES for w in weights):
        return fast.linear_group(x, weights, biases)
    return torch.cat([linear(x, w, b) for w, b in zip(weights, biases)], dim=-1)


def packed_types() -> frozenset[T]:
    """The types ``prepare`` lays out again for the tiles in use (a copy in memory): none where
    they compute from the file's layout."""
    fast = fast_backend()
    return fast.packed_types() if fast is not None and hasattr(fast, "packed_types") else frozenset()


def fast_types() -> tuple[T, ...]:
    """The types the backend in use computes itself (the others run on the reference)."""
    fast = fast_backend()
    return tuple(t for t in SUPPORTED_TYPES if fast is not None and t in fast.TYPES)


def backend_detail() -> str:
    """" (AVX-512 VNNI)" where the compiled backend's tiles use it, " (AVX-512 VNNI, AMX-INT8)"
    where Q4_K / Q6_K against many rows run on AMX tiles too."""
    fast = backends.fast()
    if fast is not None and getattr(fast, "gguf_isa", None) and fast.gguf_isa() == "amx_int8":
        return " (AVX-512 VNNI, AMX-INT8)"
    return backends.detail()


def backend_name() -> str:
    """'gguf linear cpu_avx2 (AVX-512 VNNI)': the backend and tile set that run here."""
    return f"gguf linear {active_backend()}{backend_detail()}"


__all__ = ["SUPPORTED_TYPES", "GgufWeight", "packed_types", "active_backend", "available_backends", "backend_detail", "backend_name", "linear_group",
           "dequantize", "fast_backend", "fast_types", "linear", "prepare", "use_backend"]
