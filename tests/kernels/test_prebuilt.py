"""A packaged (frozen) app has no compiler: every kernel package loads the module its build
shipped in kernels/<package>/prebuilt/ (packaging/tandem.spec), and refuses clearly without it."""
import shutil
import sys

import pytest
import torch

from kernels import build


def test_a_frozen_app_loads_a_shipped_module_instead_of_compiling(monkeypatch, tmp_path):
    from kernels.quant_linear import cpu_avx2, reference

    if not cpu_avx2.available():
        pytest.skip("no compiled int8 kernel on this machine")
    compiled = cpu_avx2._module().__file__  # what the spec ships
    (tmp_path / "prebuilt").mkdir()
    shutil.copy(compiled, tmp_path / "prebuilt")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    # As a package's cpu_avx2 asks for it: the source's folder holds prebuilt/.
    module = build.compile_avx2("tandem_quant_linear_avx2", tmp_path / "quant_linear_avx2.cpp")
    assert module.__spec__.origin.startswith(str(tmp_path / "prebuilt"))
    q, scale = reference.quantize(torch.randn(24, 64))
    x = torch.randn(3, 64)
    assert torch.equal(module.linear_int8w_a16(x, q, scale, None), cpu_avx2.linear_a16(x, q, scale))


def test_a_frozen_app_without_the_module_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    with pytest.raises(RuntimeError, match="no compiled CPU kernel tandem_attention_avx2"):
        build.compile_avx2("tandem_attention_avx2", tmp_path / "attention_avx2.cpp")
