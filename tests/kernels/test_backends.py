"""The backend registry every CPU kernel package uses."""
import pytest

from kernels import quant_linear
from kernels.backends import CpuBackends
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
