"""Compile a kernel package's AVX2 extension with torch's cpp_extension (on first use; the
set-up does it ahead of time, so a request or a timed test never waits for a compiler).

A packaged (frozen) app has no compiler and no torch headers, so it never compiles: the build
compiles every package's module once and ships it in ``kernels/<package>/prebuilt/``
(packaging/tandem.spec), and ``compile_avx2`` loads it from there. Without it the package's
backends fall back to its reference kernel (correct, slower)."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import torch
from filelock import FileLock

KERNELS = Path(__file__).parent
TORCH_LOCK = "lock"  # torch's FileBaton in a build dir
PREBUILT = "prebuilt"  # the folder, next to a package's source, that a packaged app ships its module in


def cpu_supports_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def headers_for(source: Path, uses: tuple[str, ...] = ()) -> tuple[Path, ...]:
    """The headers ``source`` may include: those next to it, those of the kernel packages it
    ``uses`` (kernels/<package>/*.h) and the shared ones (kernels/*.h: avx2_common.h, the tiles)."""
    folders = [source.parent, *(KERNELS / package for package in uses), KERNELS]
    return tuple(header for folder in folders for header in sorted(folder.glob("*.h")))


def compile_avx2(name: str, source: Path, headers: tuple[Path, ...] = (), extra_cflags: tuple[str, ...] = ()):
    """The compiled module for ``source`` (plus any ``headers`` it includes, from their folders).

    The module name carries a digest of the checkout path and the sources: checkouts share
    torch's extension dir, and two of them under one name would rebuild each other's copy on
    every load; a changed source gets its own build. ``extra_cflags``: more ISA flags (-mf16c);
    every AVX2 CPU has F16C."""
    if getattr(sys, "frozen", False):
        return load_prebuilt(name, source.with_name(PREBUILT))
    from torch.utils.cpp_extension import load

    build_dir = build_directory(name, source, headers)
    build_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(build_dir.with_name(build_dir.name + ".tandem-lock")):
        (build_dir / TORCH_LOCK).unlink(missing_ok=True)  # a process killed inside torch's load left it
        return load(
            name=build_dir.name,
            sources=[str(source)],
            extra_include_paths=sorted({str(h.parent) for h in headers}),
            extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp", *extra_cflags],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
            verbose=False,
        )


def build_directory(name: str, source: Path, headers: tuple[Path, ...] = ()) -> Path:
    """Where torch builds ``source``: its extensions root (``TORCH_EXTENSIONS_DIR`` or its
    default), the Python version's folder, then the name with its digest."""
    from torch.utils.cpp_extension import get_default_build_root

    digest = hashlib.sha256(str(source).encode() + source.read_bytes() + b"".join(h.read_bytes() for h in headers))
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    return root / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / f"{name}_{digest.hexdigest()[:10]}"


def avx2_extension(name: str, source, uses: tuple[str, ...] = (), extra_cflags: tuple[str, ...] = ()):
    """``(available, module)`` for a package's cpu_avx2.py: ``module()`` compiles (or, packaged,
    loads) the file ``source()`` names, with the headers ``headers_for`` gives it, once, and
    returns it; ``available()`` says whether this CPU runs it, compiling it first, so that the
    backend registry (kernels/backends.py) catches a failing build once and falls back.
    ``source`` is asked on the first build, not before: a test may point it elsewhere."""

    @functools.cache
    def module():
        path = source()
        return compile_avx2(name, path, headers_for(path, uses), extra_cflags)

    def available() -> bool:
        if not cpu_supports_avx2():
            return False
        module()
        return True

    return available, module


def load_prebuilt(name: str, folder: Path):
    """The module compiled ahead of time as ``name`` (any digest) in ``folder``."""
    found = sorted(folder.glob(f"{name}_*.*")) if folder.is_dir() else []
    if not found:
        raise RuntimeError(f"this build carries no compiled CPU kernel {name}")
    # The module's init symbol is named after the name it was compiled under: load it by that name.
    module_name = found[0].name.split(".")[0]
    spec = importlib.util.spec_from_file_location(module_name, found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
