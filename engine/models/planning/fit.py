"""Whether a catalog entry fits a machine, at which context, and what to recommend.

``assess`` weighs an entry's memory estimate (``engine.models.planning.memory_fit``) against each device's
budget less headroom for the OS (GPU VRAM, Apple unified memory, else RAM) and says where it
fits, at what context, and why; ``recommend`` ranks the entries by fit, then by expected speed.

An entry runs from safetensors at the engine's precisions (bf16 / fp32 / int8 / int4) or, where
the catalog lists GGUF variants (engine.models.planning.variants), from one of those files at precision
"file". ``recommend`` weighs both: per entry the variant that fits best, then the faster one
(engine.models.planning.decode_speed: bytes read per token; a Q4_K_M file reads its size a token).

No torch here: the app runs this on the GUI thread.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.models.planning.catalog import FILE_PRECISION, CatalogEntry, canonical_precision
from engine.models.planning.decode_speed import predict_plain_rate
from engine.models.planning.hardware import GB, Hardware
from engine.models.planning.memory_fit import (
    CONTEXT_LADDER,
    FIT_ORDER,
    HEADROOM_FRACTION,
    HEADROOM_MIN,
    MIN_CONTEXT,
    Device,
    Fit,
    MemoryEstimate,
    estimate_memory,
)
from engine.models.planning.variants import GGUF_DEVICES, SAFETENSORS, GgufVariant, paired_drafter_variant

#: Where a model's files come from (FitResult.source): the Hub (catalog entries), PyPI (the
#: offline default pair), or a file found on this machine, by the app that put it there.
SOURCES = ("hub", "pypi", "local", "lmstudio", "ollama", "llama.cpp", "imported")


@dataclass(frozen=True)
class FitResult:
    """``fit``: "gpu" / "unified" / "cpu" = fits there with headroom; "tight" = fits on
    ``device`` without headroom; "none" = fits nowhere (``device`` is where it came closest).
    ``available``: the memory budget of ``device`` in bytes."""

    entry: CatalogEntry
    precision: str
    context: int
    device: Device
    estimate: MemoryEstimate
    fit: Fit
    reason: str
    recommended: bool
    predicted_speedup: tuple[float, float]
    available: int = 0
    #: Plain decoding tokens/sec expected on the CPU (weights read once per token at the
    #: memory bandwidth its cores reach); None off the CPU or when the core count is unknown.
    cpu_tok_s: float | None = None
    #: What runs: a GGUF variant's quant ("Q4_K_M", precision "file") or SAFETENSORS.
    variant: str = SAFETENSORS
    #: Bytes to fetch or read: the GGUF file(s) of ``variant``; for safetensors the weights at
    #: ``precision`` as the Hub stores them (bf16), None where unknown.
    file_bytes: int | None = None
    #: Where the files come from, one of SOURCES ("hub" for catalog entries). Filled from the
    #: entry, so an entry made for a file found on this machine says which app it came from.
    source: str = "hub"
    #: The GGUF files that run (target, and the drafter's next to it), for the download; None
    #: for safetensors (and for a drafter the loader quantizes from its safetensors).
    gguf: GgufVariant | None = None
    drafter_gguf: GgufVariant | None = None

    def to_dict(self) -> dict[str, Any]:
        e = self.entry
        return {
            "id": e.id,
            "name": e.name,
            "family": e.family,
            "target_repo": e.target_repo,
            "drafter_repo": e.drafter_repo,
            "drafter_kind": e.drafter_kind,
            "target_params": e.target_params,
            "drafter_params": e.drafter_params,
            "precision": self.precision,
            "context": self.context,
            "device": self.device,
            "estimate_bytes": {**self.estimate.to_dict(), "total": self.estimate.total},
            "available_bytes": self.available,
            "fit": self.fit,
            "reason": self.reason,
            "recommended": self.recommended,
            "predicted_speedup": list(self.predicted_speedup),
            "conservative": self.estimate.conservative,
            "license": e.license,
            "gated": e.gated,
            "source": self.source,
            "variant": self.variant,
            "file_bytes": self.file_bytes,
            "gguf": self.gguf.to_dict() if self.gguf else None,
            "drafter_gguf": self.drafter_gguf.to_dict() if self.drafter_gguf else None,
            # Where the numbers came from, when not the catalog file itself (which cites its sources).
            "notes": [*e.notes, *(e.target_arch.notes if e.target_arch.source != "catalog" else ())],
        }



# -- fitting ---------------------------------------------------------------------------------


def device_budgets(hardware: Hardware) -> list[tuple[Device, int, str]]:
    """(device, bytes a model may use there, label), best device first."""
    budgets: list[tuple[Device, int, str]] = []
    gpu = hardware.best_gpu
    if gpu is not None:
        budgets.append(("gpu", gpu.free_bytes, gpu.name))
    if hardware.is_apple and hardware.gpu_working_set:
        # Metal keeps a process's GPU memory within the working set, and CPU and GPU share RAM.
        budgets.append(("unified", min(hardware.gpu_working_set, hardware.ram_available), "unified memory"))
    budgets.append(("cpu", hardware.ram_available, "RAM"))
    return budgets


def headroom(budget: int) -> int:
    return max(HEADROOM_MIN, int(budget * HEADROOM_FRACTION))


def _gb(n: int) -> str:
    return f"{n / GB:.1f} GB"


# The offline default pair's drafter runs from its converted folder next to either target, its
# GGUF file or its converted one (engine.models.loading.default_pair.prepare_pair: the int8 / int4
# drafters built from it are the measured ones); the loader quantizes it.
CONVERTED_DRAFTER_SOURCES = ("pypi",)


def drafter_variant_for(entry: CatalogEntry, variant: GgufVariant | None) -> GgufVariant | None:
    """The drafter file the app loads next to a GGUF target, which the loader runs on its own
    blocks: the one the download pairs with ``variant`` (``paired_drafter_variant``: the same
    quantization, else the catalog's first); None for a safetensors target, a drafter without a
    GGUF build, or the offline pair (CONVERTED_DRAFTER_SOURCES): the loader then quantizes the
    draft model itself, and the fit budgets it so (memory_fit.auto_drafter_budget)."""
    if variant is None or entry.drafter_kind != "draft_model" or entry.source in CONVERTED_DRAFTER_SOURCES:
        return None
    return paired_drafter_variant(variant, entry.drafter_variants)


def cpu_kernels_for(hardware: Hardware) -> bool | None:
    """Whether the quantized CPU kernels (AVX2) run on ``hardware``, for the drafter's budget:
    not on a Mac with unified memory (Apple silicon); on a described machine, as on the x86-64
    CPUs the speed figures assume; on this one, memory_fit's guess (None)."""
    if hardware.is_apple:
        return False
    return True if hardware.source == "profile" else None


def _estimate(entry: CatalogEntry, precision: str, context: int, device: Device,
              variant: GgufVariant | None, cpu_kernels: bool | None = None) -> MemoryEstimate:
    return estimate_memory(entry, precision, context, device, variant=variant,
                           drafter_variant=drafter_variant_for(entry, variant), cpu_kernels=cpu_kernels)


def _fits(entry: CatalogEntry, precision: str, context: int, device: Device, budget: int,
          variant: GgufVariant | None = None, cpu_kernels: bool | None = None) -> bool:
    return _estimate(entry, precision, context, device, variant, cpu_kernels).total + headroom(budget) <= budget


def _context_for(entry: CatalogEntry, precision: str, device: Device, budget: int,
                 variant: GgufVariant | None = None, cpu_kernels: bool | None = None) -> int | None:
    """The longest context from CONTEXT_LADDER (within the model's limit) that fits ``device``
    with headroom, or None when even the shortest doesn't."""
    limit = entry.max_context or CONTEXT_LADDER[0]
    ladder = [c for c in CONTEXT_LADDER if c <= limit] or [limit]
    return next((c for c in ladder if _fits(entry, precision, c, device, budget, variant, cpu_kernels)), None)


def assess(entry: CatalogEntry, hardware: Hardware, precision: str = "bf16", context: int | None = None,
           devices: Collection[Device] | None = None, variant: GgufVariant | None = None) -> FitResult:
    """Where ``entry`` runs best on ``hardware``: the first device (GPU, unified memory, CPU)
    where it fits with headroom; else the first where it fits at all ("tight"); else "none".
    ``context`` None: on the best device where a usable context fits, the longest that does
    (see ``recommended_context``). ``devices``: consider only those device kinds.
    ``variant``: one of the entry's GGUF builds (precision "file" then, and only the devices a
    GGUF target runs on, GGUF_DEVICES)."""
    precision = canonical_precision(precision)
    if precision == FILE_PRECISION and variant is None:
        if not entry.variants:
            raise ValueError(f"{entry.id}: precision 'file' needs a GGUF variant, and it has none")
        variant = entry.variants[0]  # the smallest quant (the catalog lists them so)
    if variant is not None:
        precision = FILE_PRECISION
        devices = [d for d in (devices if devices is not None else GGUF_DEVICES) if d in GGUF_DEVICES]
    budgets = [b for b in device_budgets(hardware) if devices is None or b[0] in devices]
    kernels = cpu_kernels_for(hardware)
    if not budgets:
        raise ValueError(f"this machine has none of the devices {sorted(devices or ())}")
    chosen = None
    if context is None:
        for device, budget, label in budgets:
            found = _context_for(entry, precision, device, budget, variant, kernels)
            if found is not None:
                context, chosen = found, (device, budget, label, device)
                break
        else:
            context = min(MIN_CONTEXT, entry.max_context or MIN_CONTEXT)
    elif context < 1:
        raise ValueError(f"context must be at least 1 token, not {context}")
    estimates = {device: _estimate(entry, precision, context, device, variant, kernels) for device, _, _ in budgets}
    if chosen is None:  # comfortable fits first, best device first
        chosen = next(((d, b, label, d) for d, b, label in budgets if estimates[d].total + headroom(b) <= b), None)
    if chosen is None:
        chosen = next(((d, b, label, "tight") for d, b, label in budgets if estimates[d].total <= b), None)
    if chosen is None:  # report against the device that came closest
        device, budget, label = max(budgets, key=lambda b: b[1] - estimates[b[0]].total)
        chosen = (device, budget, label, "none")
    device, budget, label, fit = chosen
    estimate = estimates[device]
    need = f"needs {_gb(estimate.total)}, {_gb(budget)} free ({label})"
    if fit == "tight":
        reason = f"{need}: fits with only {_gb(budget - estimate.total)} to spare"
    elif fit == "none":
        reason = f"{need}: does not fit"
    else:
        reason = need
    if estimate.conservative:
        reason += " (conservative estimate: architecture not fully known)"
    rate = cpu_decode_rate(hardware, estimate, precision) if device == "cpu" and fit != "none" else None
    if rate is not None:
        reason += f"; about {rate:.0f} tok/s plain on {hardware.cpu_cores} cores" if rate >= 1.5 else \
            f"; slow here: about {rate:.1f} tok/s plain on {hardware.cpu_cores} cores"
    return FitResult(
        entry=entry,
        precision=precision,
        context=context,
        device=device,
        estimate=estimate,
        fit=fit,
        reason=reason,
        recommended=False,
        predicted_speedup=entry.speedup_prior,
        available=budget,
        cpu_tok_s=rate,
        variant=variant.quant if variant is not None else SAFETENSORS,
        file_bytes=variant.file_bytes if variant is not None else _stored_bytes(entry),
        source=entry.source,
        gguf=variant,
        drafter_gguf=drafter_variant_for(entry, variant),
    )


def _stored_bytes(entry: CatalogEntry) -> int | None:
    # Safetensors on the Hub hold bf16 weights (memory_fit.STORED_PRECISION); the default pair's
    # download is its GGUF file.
    if entry.download_bytes:
        return entry.download_bytes
    return entry.weight_bytes("bf16") if entry.target_params else None


def recommended_context(entry: CatalogEntry, hardware: Hardware, precision: str = "bf16") -> int:
    """The longest context from CONTEXT_LADDER (up to the model's own limit) that fits with
    headroom on the best device where any does; MIN_CONTEXT when none does. Best device first:
    a model that fits the GPU at 8k is better run there than on the CPU at 32k."""
    return assess(entry, hardware, precision, None).context


# Decoding on a CPU reads every resident weight once per token, so its rate is the memory
# bandwidth the cores reach over the bytes resident. Measured here (2 EPYC cores, default
# target in bf16 with the AVX2 kernel): ~4 tok/s over 3.1 GB, about 6 GB/s per core; one
# socket's memory caps it.
CPU_BANDWIDTH_PER_CORE = 6e9
CPU_BANDWIDTH_CAP = 60e9
# Below this plain rate a model answers too slowly to chat with, however well it fits: on a
# CPU the recommendation prefers the largest model that reaches it.
INTERACTIVE_TOK_S = 2.5


def cpu_decode_rate(hardware: Hardware, estimate: MemoryEstimate, precision: str = "bf16") -> float | None:
    """Expected plain tokens/sec on the CPU, or None when the core count is unknown. A GGUF
    file's rate is decode_speed's (its own kernels' bandwidth over the bytes read a token)."""
    if not hardware.cpu_cores:
        return None
    if canonical_precision(precision) == FILE_PRECISION:
        # A described machine's CPU class is unknown: the AVX2 figures, the lower ones.
        klass = "avx2" if hardware.source == "profile" else None
        hint = predict_plain_rate(hardware, estimate.weights + estimate.drafter // 3, FILE_PRECISION, klass)
        return hint.tok_s if hint else None
    bandwidth = min(CPU_BANDWIDTH_PER_CORE * hardware.cpu_cores, CPU_BANDWIDTH_CAP)
    return bandwidth / max(1, estimate.weights + estimate.drafter // 3)  # the drafter runs for a fraction of the time


def _rank_key(result: FitResult) -> tuple:
    # GPU before unified memory before CPU; on the CPU, models fast enough to chat with first;
    # then the largest model, then the bigger expected gain.
    low, high = result.predicted_speedup
    slow = result.cpu_tok_s is not None and result.cpu_tok_s < INTERACTIVE_TOK_S
    return (FIT_ORDER[result.fit], slow, -result.entry.target_params, -(low + high), result.entry.id)


# Where recommend's default offers 4-bit: torch's int4 kernels on a GPU or a Mac (on the CPU the
# engine has its own int4, chosen by asking for it).
_DEVICES_4BIT = ("gpu", "unified")


def default_precisions(hardware: Hardware) -> tuple[str, ...]:
    """16-bit, and on a machine with a GPU or Apple unified memory 4-bit too (torch's int4
    kernels, kernels/int4pack): at 5 bits a weight an 8B model fits an 8-12 GB GPU or a 16 GB
    Mac, where 16 bits hold ~3-4B."""
    return ("bf16", "int4") if hardware.best_gpu is not None or hardware.is_apple else ("bf16",)


def _speed_key(result: FitResult) -> float:
    return -(result.cpu_tok_s or 0.0)


def _variant_candidates(entry: CatalogEntry, hardware: Hardware, context: int | None) -> list[FitResult]:
    return [assess(entry, hardware, FILE_PRECISION, context, variant=v) for v in entry.variants]


def recommend(entries: Iterable[CatalogEntry], hardware: Hardware, context: int | None = None,
              precisions: Sequence[str] | None = None) -> list[FitResult]:
    """Every entry assessed on ``hardware``, best first; exactly one is marked recommended when
    anything fits. Each entry is tried in ``precisions`` (in order of preference) and reported in
    the first one that fits with headroom (or the first, if none does). By default
    (``default_precisions``): 16-bit, the precision the engine runs fast, and on a GPU or a Mac
    4-bit where 16-bit does not fit that device: a model on the GPU at 4 bits beats the same
    model on the CPU at 16 (4-bit is not offered for the CPU here: its recommendation is as
    before).

    GGUF variants (precision "file") are weighed too by default, or when ``precisions`` names
    "file": each of the entry's GGUF files next to its safetensors precisions, the best fit
    first, then the faster on the CPU (a Q4_K_M file reads a third of bf16's bytes a token),
    then the order of preference (safetensors precisions as listed, then the files smallest
    first)."""
    on_device_4bit = precisions is None
    wanted = [canonical_precision(p) for p in (default_precisions(hardware) if precisions is None else precisions)]
    if not wanted:
        raise ValueError("recommend needs at least one precision")
    with_variants = precisions is None or FILE_PRECISION in wanted
    wanted = [p for p in wanted if p != FILE_PRECISION]
    results = []
    for entry in entries:
        files = _variant_candidates(entry, hardware, context) if with_variants else []
        # Only "file" asked and no GGUF build: the entry still shows, as its safetensors in bf16.
        offered = [p for p in wanted if p in entry.precisions] or wanted[:1] or ([] if files else ["bf16"])
        if on_device_4bit:
            candidates = [assess(entry, hardware, p, context, None if p != "int4" else _DEVICES_4BIT) for p in offered]
            candidates += files
            results.append(min(candidates, key=lambda r: (FIT_ORDER[r.fit], _speed_key(r), candidates.index(r))))
            continue
        candidates = [assess(entry, hardware, p, context) for p in offered] + files
        comfortable = [r for r in candidates if FIT_ORDER[r.fit] < FIT_ORDER["tight"]]
        if files:  # weigh the files against the listed precisions: best fit, then speed
            results.append(min(candidates, key=lambda r: (FIT_ORDER[r.fit], _speed_key(r), candidates.index(r))))
        else:
            results.append(comfortable[0] if comfortable else candidates[0])
    results.sort(key=_rank_key)
    for i, result in enumerate(results):
        if result.fit != "none":
            results[i] = replace(result, recommended=True)
            break
    return results
