"""The backends of one CPU kernel package: its pure-torch reference (the specification, always
there) and its compiled AVX2 module (``kernels/<package>/cpu_avx2.py``) where it builds and runs.

The compiled one is probed once, on first use (that is when it compiles); a failure is logged
once and the reference serves. ``TANDEM_NO_CPU_KERNELS`` skips the probe. ``use(name)`` overrides
the choice (tests, benchmarks). ``package_api`` gives each package its functions about them.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
from types import ModuleType

log = logging.getLogger(__name__)

FAST = "cpu_avx2"


class CpuBackends:
    def __init__(self, package: str, reference: ModuleType, what: str, isa: str | None = None) -> None:
        self.package = package
        self.reference = reference
        self.what = what  # for the log line: "int8 linear", "attention", ...
        self.isa = isa  # the compiled module's query of the tile set it runs ("a16_isa"), if it has one
        self._modules: dict[str, ModuleType] = {"reference": reference}
        self._probed = False
        self._active: ModuleType | None = None

    def available(self) -> list[str]:
        """Backend names, compiling the fast one on the first call."""
        if not self._probed:
            self._probed = True
            if not os.environ.get("TANDEM_NO_CPU_KERNELS"):
                try:
                    module = importlib.import_module(f"kernels.{self.package}.{FAST}")
                    if module.available():
                        self._modules[FAST] = module
                except Exception as exc:  # no compiler, unsupported CPU: the reference still works
                    log.warning("fast %s kernel unavailable (%s)", self.what, exc)
        return sorted(self._modules)

    @property
    def active(self) -> ModuleType:
        """The backend in use: the fast one where available, unless ``use`` chose another."""
        if self._active is None:
            self.available()
            self._active = self._modules.get(FAST, self.reference)
        return self._active

    def fast(self) -> ModuleType | None:
        """The backend in use when it is not the reference, else None."""
        return None if self.active is self.reference else self.active

    def active_name(self) -> str:
        active = self.active  # probes first: the dict may grow
        return next(name for name, module in self._modules.items() if module is active)

    def use(self, name: str) -> None:
        self.available()
        if name not in self._modules:
            raise ValueError(f"unknown {self.package} backend {name!r}; available: {sorted(self._modules)}")
        self._active = self._modules[name]

    def detail(self) -> str:
        """What a kernel report adds to the backend's name: " (AVX-512 VNNI)" where the compiled
        backend is in use and its tiles use it (they follow the CPU, see ``isa``)."""
        fast = self.fast()
        return " (AVX-512 VNNI)" if fast is not None and self.isa and getattr(fast, self.isa)() == "avx512_vnni" else ""


def package_api(package: str):
    """The functions a kernel package exports about its backends:
    ``available_backends, active_backend, fast_backend, use_backend = package_api(__name__)``.
    Each asks the package's ``backends`` registry when called (a test may swap in a fresh one)."""

    def registry() -> CpuBackends:
        return sys.modules[package].backends

    def available_backends() -> list[str]:
        """Backend names (compiling the fast one on the first call)."""
        return registry().available()

    def active_backend() -> str:
        """The name of the backend the package's ops run on now (choosing it on first call)."""
        return registry().active_name()

    def fast_backend() -> ModuleType | None:
        """The compiled backend when it is the one in use, else None (then the package's ops
        run on the reference: correct, slower)."""
        return registry().fast()

    def use_backend(name: str) -> None:
        registry().use(name)

    return available_backends, active_backend, fast_backend, use_backend
