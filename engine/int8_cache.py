"""int8 weights of a converted target, kept on disk so that only the first int8 load quantizes.

One safetensors file per model folder under the user cache dir (``<cache>/int8/``): for every
converted linear layer ``{name}.q`` (int8 [N, K]) and ``{name}.scale`` (fp32 [N]). The file name
holds the folder's name, a digest of where it is and of its weight files' sizes and modification
times (a re-downloaded or re-converted model gets a new entry), and ``VERSION``, bumped whenever
the quantization rule (kernels.quant_linear.reference.quantize) changes.
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch

from engine.paths import cache_dir

log = logging.getLogger(__name__)

VERSION = 1  # of the quantization rule: per-output-row symmetric int8, round half to even


def cache_path(model_dir: Path) -> Path:
    model_dir = Path(model_dir).resolve()
    key = hashlib.sha256(str(model_dir).encode())
    for f in sorted(model_dir.glob("*.safetensors")):
        stat = f.stat()
        key.update(f"{f.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_dir() / "int8" / f"{model_dir.name}-{key.hexdigest()[:12]}-v{VERSION}.safetensors"


def load(model_dir: Path) -> dict[str, torch.Tensor] | None:
    """The cached int8 weights of ``model_dir``, or None when there are none (or unreadable)."""
    path = cache_path(model_dir)
    if not path.exists():
        return None
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as exc:  # a truncated or foreign file: convert again and overwrite it
        log.warning("ignoring unreadable int8 cache %s (%s)", path, exc)
        return None


def save(model_dir: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Write the int8 weights atomically (a partial file is never read as a cache)."""
    from safetensors.torch import save_file

    path = cache_path(model_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"tandem_int8_version": str(VERSION)})
    os.replace(tmp, path)
    log.info("cached int8 weights of %s in %s", Path(model_dir).name, path)
    return path
