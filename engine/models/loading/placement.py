"""Where a model runs, at which precision, and whether it fits there, decided before loading.

    pick_device      CUDA, else Apple MPS, else the CPU ("auto"), or what the user asked for
    dtype_for        exact: float32 everywhere; fast: bf16 on CPU and on CUDA GPUs that have it
                     (compute capability 8.0+), fp16 on older CUDA GPUs and on MPS; int8, and
                     int4 on the CPU: float32 activations (the engine's own kernels); int4 on
                     CUDA / MPS: bf16 / fp16 activations around torch's int4 kernels
                     (kernels/int4pack)
    weights_name     the memory fit's name for how a precision mode holds the weights
    check_fits       the memory fit's estimate for the folder(s) about to load, against what the
                     device has free now; a readable ``DoesNotFit`` instead of an allocator error
                     half-way through a load

Target and drafter go on the same device: verification compares their distributions row by
row, and a cross-device copy per draft token would cost more than the drafter saves.
The CPU is not checked (behaviour there is as before: the OS pages, it does not refuse).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch

from engine.core.settings import Precision
from engine.models.planning.catalog import (
    CatalogEntry,
    architecture_from_config,
    entry_from_config,
    estimate_params,
    read_config,
    safetensors_params,
)
from engine.models.planning.fit import device_budgets
from engine.models.planning.hardware import Hardware
from engine.models.planning.memory_fit import DEFAULT_CONTEXT, MemoryEstimate, estimate_memory, human_bytes
from kernels import int4pack

log = logging.getLogger(__name__)

_PRECISION_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# Which of memory_fit's device kinds a torch device is.
_KINDS = {"cuda": "gpu", "mps": "unified", "cpu": "cpu"}


class DoesNotFit(ValueError):
    """The model (and drafter) would not fit the device's free memory; the message says by how
    much and what to change."""


def pick_device(requested: str = "auto") -> torch.device:
    if requested != "auto":
        return torch.device(requested)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def bf16_supported(device: torch.device) -> bool:
    """Whether 16-bit work on ``device`` should be bfloat16: always on the CPU (the fast linear
    kernel and avx512_bf16 use it), on CUDA from Ampere (8.0) on; not on MPS, where bf16 is
    emulated on M1/M2 GPUs and needs macOS 14, while fp16 is native on every Apple GPU."""
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        try:
            return torch.cuda.get_device_capability(device)[0] >= 8
        except Exception:  # no driver: the caller fails on .to(device) with a clearer message
            return True
    return False


def dtype_for(precision: Precision, device: torch.device, bf16: bool | None = None) -> torch.dtype:
    """The dtype activations (and float weights) take. exact: float32 everywhere (greedy
    speculation is then token-identical to plain). fast: bfloat16 where ``bf16`` (default:
    ``bf16_supported(device)``), else float16. int8: float32 activations around int8 weights
    (the int8 kernel reads fp32 rows natively), and so int4 on the CPU. int4 on CUDA: bfloat16
    (torch's int4 kernel reads nothing else); on MPS: float16."""
    if precision == "int4" and device.type in ("cuda", "mps"):
        return int4pack.device_dtype(device)
    if precision in ("fp32", "int8", "int4", "file"):  # file: a GGUF model's kernels read fp32 rows
        return torch.float32
    if precision != "bf16":
        raise ValueError(f"precision must be 'file', 'bf16', 'fp32', 'int8' or 'int4', not {precision!r}")
    if bf16 is None:
        bf16 = bf16_supported(device)
    return torch.bfloat16 if bf16 else torch.float16


def weights_name(precision: Precision, device: torch.device) -> str:
    """How ``precision`` holds the target's weights, as the memory fit names it."""
    return precision if precision in ("int8", "int4") else precision_name(dtype_for(precision, device))


def precision_name(dtype: torch.dtype) -> str:
    """The memory fit's name for a dtype ("fp32", "bf16", "fp16")."""
    try:
        return _PRECISION_NAMES[dtype]
    except KeyError:
        raise ValueError(f"no memory estimate for dtype {dtype}") from None


# -- memory ------------------------------------------------------------------------------------


def model_entry(target: Path, drafter: Path | None = None) -> CatalogEntry:
    """A memory-fit entry for model folders: shapes from config.json, parameter counts from the
    safetensors headers (or estimated from the shapes when there are none)."""
    target = Path(target)
    config = read_config(target)
    if config is None:
        raise FileNotFoundError(f"{target} is not a model folder (no readable config.json)")
    entry = entry_from_config(target.name, config, params=safetensors_params(target), name=target.name)
    if drafter is None:
        return entry
    drafter = Path(drafter)
    dconfig = read_config(drafter)
    if dconfig is None:
        raise FileNotFoundError(f"{drafter} is not a model folder (no readable config.json)")
    arch = architecture_from_config(dconfig, source=str(drafter / "config.json"))
    params = safetensors_params(drafter)
    if params is None:
        params = estimate_params(arch, dconfig)
    return replace(entry, drafter_repo=drafter.name, drafter_kind="draft_model", drafter_arch=arch, drafter_params=params)


def free_memory(device: torch.device, hardware: Hardware | None = None) -> tuple[int, str]:
    """(bytes a model may still use on ``device``, a label for messages). From ``hardware``
    when given (a described machine, or a detection made earlier), else measured now."""
    kind = _KINDS.get(device.type)
    if kind is None:
        raise ValueError(f"no memory check for device type {device.type!r}")
    if hardware is not None:
        for budget_kind, budget, label in device_budgets(hardware):
            if budget_kind == kind:
                return budget, label
        raise DoesNotFit(f"this machine has no {device.type.upper()} device to load a model on")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        free, _total = torch.cuda.mem_get_info(index)
        return int(free), torch.cuda.get_device_name(index)
    import psutil

    available = int(psutil.virtual_memory().available)
    if device.type == "mps":
        # Metal keeps a process within its recommended working set; what this process already
        # holds there counts against it.
        working_set = int(torch.mps.recommended_max_memory()) - int(torch.mps.driver_allocated_memory())
        return min(working_set, available), "unified memory"
    return available, "RAM"


def check_fits(target: Path, drafter: Path | None, dtype: torch.dtype, device: torch.device,
               context: int = DEFAULT_CONTEXT, hardware: Hardware | None = None, weights: str | None = None) -> MemoryEstimate:
    """Raise ``DoesNotFit`` when target (+ drafter) at ``dtype`` with ``context`` tokens of K/V
    would not fit ``device``'s free memory; return the estimate otherwise. ``weights`` ("int8",
    "int4") overrides the weight format ``dtype`` implies. Fitting without the memory fit's headroom is
    allowed, with a warning (the OS or other apps may need it)."""
    entry = model_entry(target, drafter)
    precision = weights or precision_name(dtype)
    kind = _KINDS[device.type]
    estimate = estimate_memory(entry, precision, context, kind)
    budget, label = free_memory(device, hardware)
    what = entry.name + (f" with its drafter {entry.drafter_repo}" if entry.drafter_repo else "")
    parts = f"weights {human_bytes(estimate.weights)}, K/V cache {human_bytes(estimate.kv_cache)}"
    if estimate.drafter:
        parts += f", drafter {human_bytes(estimate.drafter)}"
    parts += f", runtime {human_bytes(estimate.overhead)}"
    if estimate.total > budget:
        advice = ["a smaller model", "a shorter context"]
        if dtype == torch.float32:
            advice.insert(0, "'bf16' precision (16-bit, half the memory)")
        if device.type != "cpu" and precision != "int4":
            advice.insert(0, "'int4' precision (4-bit weights, about a third of 16-bit's memory)")
        if device.type != "cpu":
            advice.append("the CPU (device 'cpu')")
        raise DoesNotFit(
            f"{what} does not fit: it needs {human_bytes(estimate.total)} at {precision} with "
            f"{context:,} tokens of context ({parts}), but {label} has {human_bytes(budget)} free. "
            f"Try {', '.join(advice[:-1])} or {advice[-1]}."
        )
    if estimate.total > budget * 0.9:
        log.warning("%s fits %s with little to spare: needs %s of %s free", what, label,
                    human_bytes(estimate.total), human_bytes(budget))
    log.info("%s on %s at %s: needs %s (%s), %s free", what, device, precision,
             human_bytes(estimate.total), parts, human_bytes(budget))
    return estimate
