"""Quantized (int8, int4) weights of a converted model, kept on disk so that only the first
load at that precision quantizes.

One safetensors file per model folder, kind and role under the user cache dir (``<cache>/int8/``,
``<cache>/int4/`` for targets, ``<cache>/int8-drafter/``, ``<cache>/int4-drafter/`` for draft
models): for every converted linear layer ``{name}.q`` (int8 [N, K]) and ``{name}.scale`` (fp32
[N]), or int4's ``{name}.packed`` / ``.scale`` / ``.offset``. A drafter's file holds the same
layers quantized by the same rule, less the LM head (its reduced head quantizes only the rows it
keeps, at every load: milliseconds); a folder used in both roles keeps one file per role, so
neither role's load takes the other's file for a damaged one and rewrites it. The file name
holds the folder's name, a digest of where it is and of its weight files' sizes and modification
times (a re-downloaded or re-converted model gets a new entry), and ``VERSION``, bumped whenever
the quantization rule (kernels.quant_linear.reference.quantize) changes.

Integrity: the header records an xxh3-128 digest of every tensor (name, dtype, shape, bytes)
computed from the weights in memory before they were written; a load hashes what it read and
compares. For the 1.5 GB int8 cache of the default target that takes ~0.2 s (0.5 s on a busy
machine), mostly paging in the memory-mapped file, which the first forward pass did before
(same run, 2 cores, medians of 6: load_model 0.95 -> 1.13 s; load plus first forward 3.15 s
without, 2.74 s with: no slower). A
file that is unreadable, truncated, has no digest (an older Tandem wrote it) or does not match
its digest (a NaN written over a scale, a bad sector) is removed and quantized again, with a
warning. Files are written under a temporary name, flushed to disk and renamed, so a killed
run leaves no file under the cache's name, only a temporary that a later run removes.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core import scratch_files
from engine.core.paths import cache_dir
from engine.quant.quantize import DamagedWeights

log = logging.getLogger(__name__)

VERSION = 1  # of the quantization rule: per-output-row symmetric int8, round half to even
# Versions per kind ("int8": the rule above; "int4": kernels.int4_linear.reference.quantize).
VERSIONS = {"int8": VERSION, "int4": 2}  # int4 v2: fp16 scales (v1: fp32)
KINDS = tuple(VERSIONS)
ROLES = ("target", "drafter")

DIGEST_KEY = "tandem_digest"
SOURCE_KEY = "tandem_source"  # the model folder the weights were quantized from
ROLE_KEY = "tandem_role"  # "target" (LM head included) or "drafter" (without it)
_OURS = re.compile(r"-[0-9a-f]{12}-v\d+\.safetensors")  # what follows the folder's name in a cache file's name
#: What a write leaves if killed: ``save``'s ``<model>-<key>-v<version>.tmp<pid>``, and the
#: ``.tmpXXXXXX`` that safetensors' save_file writes first and renames onto it (only Tandem
#: writes in these folders).
TEMPORARY = re.compile(r".+-[0-9a-f]{12}-v\d+\.tmp(?P<pid>\d+)|\.tmp[A-Za-z0-9]{6}")


@dataclass(frozen=True)
class CacheState:
    """What ``check`` found: ``status`` "absent", "verified" or "removed" (``detail`` says why)."""

    path: Path
    status: str
    detail: str = ""


def _folder(kind: str, role: str) -> Path:
    if role not in ROLES:
        raise ValueError(f"a weight cache is a target's or a drafter's, not a {role!r}'s")
    return cache_dir() / (kind if role == "target" else f"{kind}-{role}")


def cache_path(model_dir: Path, kind: str = "int8", role: str = "target") -> Path:
    """``model_dir``: a converted model's folder, or a GGUF file (a drafter's layers re-quantized
    from it), whose own size and modification time go into the key."""
    model_dir = Path(model_dir).resolve()
    key = hashlib.sha256(str(model_dir).encode())
    for f in [model_dir] if model_dir.is_file() else sorted(model_dir.glob("*.safetensors")):
        stat = f.stat()
        key.update(f"{f.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return _folder(kind, role) / f"{model_dir.name}-{key.hexdigest()[:12]}-v{VERSIONS[kind]}.safetensors"


def tensors_digest(items: Iterable[tuple[str, torch.Tensor]]) -> str:
    """xxh3-128 over every tensor's name, dtype, shape and bytes, in name order (so the same
    weights give the same digest however a file lays them out)."""
    return _digest_in_order(sorted(items, key=lambda item: item[0]))


def _digest_in_order(items: Iterable[tuple[str, torch.Tensor]]) -> str:
    """tensors_digest of ``items`` already in name order (a generator: one tensor at a time)."""
    import xxhash

    digest = xxhash.xxh3_128()
    for name, tensor in items:
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def remove_stale_temporaries() -> int:
    """Remove temporaries that killed runs left in the cache dirs; returns the bytes freed."""
    return sum(scratch_files.remove_stale(_folder(kind, role), TEMPORARY) for kind in KINDS for role in ROLES)


def load(model_dir: Path, kind: str = "int8", verify: bool = True, role: str = "target") -> dict[str, torch.Tensor] | None:
    """The cached ``kind`` weights of ``model_dir``, checked against their digest; None when
    there are none or the file was bad (it is then removed, with a warning, to be rebuilt).
    ``verify`` False skips the hashing (only to measure what it costs)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    remove_stale_temporaries()
    path = cache_path(model_dir, kind, role)
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            recorded = (f.metadata() or {}).get(DIGEST_KEY)
        if recorded is None:
            _discard(path, kind, "has no integrity record (an earlier version of Tandem wrote it)")
            return None
        tensors = load_file(path)
    except Exception as exc:  # truncated, or not a safetensors file at all
        _discard(path, kind, f"is unreadable ({exc})")
        return None
    if verify and tensors_digest(tensors.items()) != recorded:
        _discard(path, kind, "is damaged: its contents no longer match the digest recorded when it was written")
        return None
    return tensors


def check(model_dir: Path, kind: str = "int8", role: str = "target") -> CacheState:
    """Verify ``model_dir``'s ``kind`` cache without keeping it in memory (one tensor at a
    time); a bad one is removed. For `tandem setup`, which reports what is ready."""
    from safetensors import safe_open

    path = cache_path(model_dir, kind, role)
    remove_superseded(model_dir, kind, role)
    if not path.exists():
        return CacheState(path, "absent")
    try:
        with safe_open(str(path), framework="pt") as f:
            recorded = (f.metadata() or {}).get(DIGEST_KEY)
            actual = _digest_in_order((name, f.get_tensor(name)) for name in sorted(f.keys())) if recorded else None
    except Exception as exc:
        why = f"is unreadable ({exc})"
    else:
        if recorded is None:
            why = "has no integrity record (an earlier version of Tandem wrote it)"
        elif actual != recorded:
            why = "is damaged: its contents no longer match the digest recorded when it was written"
        else:
            return CacheState(path, "verified")
    _discard(path, kind, why)
    return CacheState(path, "removed", why)


def _discard(path: Path, kind: str, why: str) -> None:
    log.warning("the %s weight cache %s %s; removing it (the next %s load quantizes the model again)", kind, path, why, kind)
    try:
        path.unlink()
    except OSError as exc:
        log.warning("could not remove %s (%s)", path, exc)


def _check_finite(tensors: dict[str, torch.Tensor], model_dir: Path) -> None:
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise DamagedWeights(
                f"{Path(model_dir)}: the weights of {name.rsplit('.', 1)[0]} hold NaN or infinite values; the model's"
                f" files are damaged: convert or download it again"
            )


def save(model_dir: Path, tensors: dict[str, torch.Tensor], kind: str = "int8",
         free: Callable[[Path], int] = scratch_files.free_bytes, role: str = "target") -> Path:
    """Write the quantized weights with their digest, atomically: under a temporary name,
    flushed to disk, then renamed (a partial file is never read as a cache). Raises
    scratch_files.NotEnoughDisk (an OSError) when the disk cannot hold them, DamagedWeights when
    they hold NaN or infinite values."""
    from safetensors.torch import save_file

    _check_finite(tensors, model_dir)
    path = cache_path(model_dir, kind, role)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch_files.remove_stale(path.parent, TEMPORARY)
    need = sum(t.numel() * t.element_size() for t in tensors.values()) + (1 << 20)
    whose = Path(model_dir).name if role == "target" else f"{Path(model_dir).name} (as a drafter)"
    scratch_files.check_free(path.parent, need, f"the {kind} weight cache of {whose}",
                             scratch_files.find(path.parent, TEMPORARY), free)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    metadata = {f"tandem_{kind}_version": str(VERSIONS[kind]), DIGEST_KEY: tensors_digest(tensors.items()),
                SOURCE_KEY: str(Path(model_dir).resolve()), ROLE_KEY: role}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        with open(tmp, "rb") as f:  # durable before it gets the cache's name
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("cached %s weights of %s (%s) in %s", kind, Path(model_dir).name, role, path)
    remove_superseded(model_dir, kind, role)
    return path


def remove_superseded(model_dir: Path, kind: str = "int8", role: str = "target") -> list[Path]:
    """Remove the cache files of ``model_dir`` that no load will read again: those of earlier
    quantization versions or of the folder's weights before they were converted or downloaded
    again (another key), and files an earlier Tandem wrote without a digest under the folder's
    name. The int8 cache of the 1.5B target is 1.5 GB. Returns the removed paths."""
    import glob

    from safetensors import safe_open

    model_dir = Path(model_dir).resolve()
    current = cache_path(model_dir, kind, role)
    removed = []
    for other in current.parent.glob(f"{glob.escape(model_dir.name)}-*-v*.safetensors"):
        if other == current or not _OURS.fullmatch(other.name[len(model_dir.name):]):
            continue
        try:
            with safe_open(str(other), framework="pt") as f:
                meta = f.metadata() or {}
        except Exception:  # unreadable: useless to anyone
            meta = {}
        if DIGEST_KEY in meta and meta.get(SOURCE_KEY) != str(model_dir):
            continue  # another folder of the same name: its cache
        try:
            other.unlink()
        except OSError as exc:
            log.warning("could not remove the superseded cache %s (%s)", other, exc)
            continue
        removed.append(other)
        log.info("removed %s: superseded (an earlier version, or weights since replaced)", other)
    return removed
