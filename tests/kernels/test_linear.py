"""Every linear backend against the reference, and the batch invariance the target relies on."""
import pytest
import torch

from kernels import linear as linear_kernels
from kernels.linear import reference


@pytest.fixture(params=linear_kernels.available_backends())
def backend(request):
    before = linear_kernels.active_backend()
    linear_kernels.use_backend(request.param)
    yield request.param
    linear_kernels.use_backend(before)  # what the import chose, for the tests that follow


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 9, 16, 33])
@pytest.mark.parametrize("k,n,bias", [(64, 48, True), (136, 20, False), (13, 7, True)])
def test_backend_matches_reference(backend, m, k, n, bias):
    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16() if bias else None
    got = linear_kernels.linear(x, w, b)
    want = reference.linear(x, w, b)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    # Same fp32 math, different summation order: at most a couple of bf16 ulps apart.
    assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_leading_dimensions_are_kept(backend):
    x = torch.randn(2, 3, 32).bfloat16()
    w = torch.randn(8, 32).bfloat16()
    assert linear_kernels.linear(x, w).shape == (2, 3, 8)


@pytest.mark.parametrize("k", [200, 203])  # 203: a scalar tail after the vector loop
def test_rows_do_not_depend_on_how_many_are_computed_together(backend, k):
    """Verifying k+1 tokens in one pass must equal k+1 one-token passes, bit for bit, for every
    row count (each has its own register tile) and for prefill-sized calls."""
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(11, k, generator=gen).bfloat16()
    w = torch.randn(70, k, generator=gen).bfloat16()
    alone = torch.cat([linear_kernels.linear(x[i : i + 1], w) for i in range(11)])
    for m in range(2, 12):
        assert torch.equal(linear_kernels.linear(x[:m], w), alone[:m]), m
    assert torch.equal(linear_kernels.linear(x[3:8], w), alone[3:8])


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown linear backend"):
        linear_kernels.use_backend("nope")


def test_fast_backend_is_built_where_the_cpu_supports_it():
    import shutil

    if shutil.which("c++") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert "cpu_avx2" in linear_kernels.available_backends()
