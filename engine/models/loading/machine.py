"""This machine as the models will meet it: its memory, CPU and disk (engine.models.planning.
hardware) and the GPUs torch can reach, CUDA or Apple's MPS. Asking torch takes a second or
more and imports it, so this runs on a worker; planning code takes the result.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from engine.models.planning.hardware import Gpu, Hardware, detect_hardware

log = logging.getLogger(__name__)


def detect_machine(cache: Path | None = None) -> Hardware:
    """This machine with its GPUs. ``cache``: where models are stored (free disk is measured
    there; default: the Hugging Face cache)."""
    return detect_hardware(cache, gpus=_cuda_gpus(), working_set=_mps_working_set())


def _cuda_gpus() -> tuple[Gpu, ...]:
    gpus = []
    try:
        if not torch.cuda.is_available():
            return ()
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            gpus.append(Gpu(name=torch.cuda.get_device_name(i), total_bytes=int(total), free_bytes=int(free)))
    except Exception as exc:  # a broken driver must not stop the app: report no GPU, say why
        log.warning("CUDA GPUs could not be queried (%s); treating this machine as CPU-only", exc)
        return ()
    return tuple(gpus)


def _mps_working_set() -> int | None:
    try:
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            return None
        recommended = getattr(torch.mps, "recommended_max_memory", None)
        return int(recommended()) if recommended else None
    except Exception as exc:
        log.warning("Apple MPS could not be queried (%s)", exc)
        return None
