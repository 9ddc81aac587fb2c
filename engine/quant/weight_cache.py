"""Quantized (int8, int4) weights of a converted target, kept on disk so that only the first
load at that precision quantizes.

One safetensors file per model folder and kind under the user cache dir (``<cache>/int8/``,
``<cache>/int4/``): for every converted linear layer ``{name}.q`` (int8 [N, K]) and
``{name}.scale`` (fp32 [N]), or int4's ``{name}.packed`` / ``.scale`` / ``.offset``. The file name
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

from engine.core.paths import cache_dir

log = logging.getLogger(__name__)

VERSION = 1  # of the quantization rule: per-output-row symmetric int8, round half to even
# Versions per kind ("int8": the rule above; "int4": kernels.int4_linear.reference.quantize).
VERSIONS = {"int8": VERSION, "int4": 2}  # int4 v2: fp16 scales (v1: fp32)


def cache_path(model_dir: Path, kind: str = "int8") -> Path:
    model_dir = Path(model_dir).resolve()
    key = hashlib.sha256(str(model_dir).encode())
    for f in sorted(model_dir.glob("*.safetensors")):
        stat = f.stat()
        key.update(f"{f.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_dir() / kind / f"{model_dir.name}-{key.hexdigest()[:12]}-v{VERSIONS[kind]}.safetensors"


def load(model_dir: Path, kind: str = "int8") -> dict[str, torch.Tensor] | None:
    """The cached ``kind`` weights of ``model_dir``, or None when there are none (or unreadable)."""
    path = cache_path(model_dir, kind)
    if not path.exists():
        return None
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as exc:  # a truncated or foreign file: convert again and overwrite it
        log.warning("ignoring unreadable int8 cache %s (%s)", path, exc)
        return None


def save(model_dir: Path, tensors: dict[str, torch.Tensor], kind: str = "int8") -> Path:
    """Write the quantized weights atomically (a partial file is never read as a cache)."""
    from safetensors.torch import save_file

    path = cache_path(model_dir, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={f"tandem_{kind}_version": str(VERSIONS[kind])})
    os.replace(tmp, path)
    log.info("cached %s weights of %s in %s", kind, Path(model_dir).name, path)
    _remove_older_versions(path)
    return path


def _remove_older_versions(path: Path) -> None:
    """The same model's files of earlier quantization rules are never read again (the int4
    cache of a 1.5B model is ~1 GB): drop them."""
    stem = path.name.rsplit("-v", 1)[0]
    for old in path.parent.glob(f"{stem}-v*.safetensors"):
        if old != path:
            try:
                old.unlink()
                log.info("removed %s, written by an earlier version", old)
            except OSError as exc:
                log.warning("could not remove the outdated cache %s (%s)", old, exc)
