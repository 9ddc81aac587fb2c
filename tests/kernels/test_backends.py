"""The backend registry every CPU kernel package uses."""
import importlib
import os
from pathlib import Path

import pytest

import kernels
from kernels import quant_linear
from kernels.backends import CpuBackends
from kernels.build import cpu_supports_avx2
from kernels.quant_linear import reference


def test_a_fresh_registry_probes_on_first_question_and_names_its_choice(monkeypatch):
    monkeypatch.delenv("TANDEM_NO_CPU_KERNELS", raising=False)
    fresh = CpuBackends("quant_linear", reference, "int8 linear")
    name = fresh.active_name()  # the first call probes (and may compile)
    assert name in fresh.available()
    assert (fresh.fast() is None) == (name == "reference")
    fresh.use("reference")
    assert fresh.active_name() == "reference" and fresh.fast() is None


def test_no_cpu_kernels_leaves_only_the_reference(monkeypatch):
    monkeypatch.setenv("TANDEM_NO_CPU_KERNELS", "1")
    fresh = CpuBackends("quant_linear", reference, "int8 linear")
    assert fresh.available() == ["reference"] and fresh.fast() is None


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown quant_linear backend"):
        quant_linear.use_backend("nope")


PACKAGES_WITH_COMPILED_TILES = sorted(p.parent.name for p in Path(kernels.__file__).parent.glob("*/cpu_avx2.py"))


@pytest.mark.skipif(not cpu_supports_avx2() or os.environ.get("TANDEM_NO_CPU_KERNELS"),
                    reason="the compiled tiles need AVX2 + FMA (and are not turned off)")
@pytest.mark.parametrize("package", PACKAGES_WITH_COMPILED_TILES)
def test_every_compiled_backend_builds_on_an_avx2_cpu(package):
    """The registry falls back to the reference where a build fails, and the kernel tests skip
    the compiled tile sets then: a compile error in a kernel would pass the suite unnoticed.
    Here it fails, with the compiler's message."""
    compiled = importlib.import_module(f"kernels.{package}.cpu_avx2")
    if hasattr(compiled, "_module"):  # a package built on the others' tiles has none of its own
        compiled._module()  # raises with the compiler's output where the build fails
    assert compiled.available()
