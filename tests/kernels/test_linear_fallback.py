"""Where the compiled kernel cannot be had (a packaged app without its prebuilt module, no
compiler), the linear op falls back to the reference kernel instead of failing."""
import sys

import torch

from kernels import linear as linear_kernels
from kernels.backends import CpuBackends
from kernels.linear import cpu_avx2, reference


def test_frozen_app_without_prebuilt_kernel_uses_the_reference(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    # A source whose folder holds no prebuilt/: nothing shipped (kernels.build looks beside it).
    monkeypatch.setattr(cpu_avx2, "SOURCE", tmp_path / "linear_avx2.cpp")
    monkeypatch.setattr(linear_kernels, "backends", CpuBackends("linear", reference, "CPU linear"))  # not probed yet
    monkeypatch.delenv("TANDEM_NO_CPU_KERNELS", raising=False)
    cpu_avx2._module.cache_clear()
    try:
        assert linear_kernels.fast_backend() is None
        assert linear_kernels.available_backends() == ["reference"]
        x, w = torch.randn(3, 16).bfloat16(), torch.randn(8, 16).bfloat16()
        assert torch.equal(linear_kernels.linear(x, w), reference.linear(x, w))
    finally:
        cpu_avx2._module.cache_clear()  # the next caller compiles/loads the real module again
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert "no compiled CPU kernel" in caplog.text
