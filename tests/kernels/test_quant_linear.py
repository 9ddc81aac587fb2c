"""int8 weight-only linear: every backend against the reference, and the quantizer's contract."""
import pytest
import torch

from kernels import quant_linear
from kernels.quant_linear import reference


@pytest.fixture(params=quant_linear.available_backends())
def backend(request):
    previous = quant_linear.active_backend()
    quant_linear.use_backend(request.param)
    yield request.param
    quant_linear.use_backend(previous)  # later tests (int8 drafters and targets) keep the fast kernel


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 13])
@pytest.mark.parametrize("k,n,bias", [(64, 48, True), (136, 20, False), (13, 7, True), (896, 70, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_matches_reference(backend, m, k, n, bias, dtype):
    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=gen).to(dtype)
    q, scale = quant_linear.quantize(torch.randn(n, k, generator=gen))
    b = torch.randn(n, generator=gen) if bias else None
    got = quant_linear.linear(x, q, scale, b)
    want = reference.linear(x, q, scale, b)
    assert got.shape == want.shape and got.dtype == dtype
    # Same fp32 math in a different summation order (and one final rounding for bf16).
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)


def test_leading_dimensions_are_kept(backend):
    q, scale = quant_linear.quantize(torch.randn(8, 32))
    assert quant_linear.linear(torch.randn(2, 3, 32), q, scale).shape == (2, 3, 8)


def test_quantization_error_is_at_most_half_a_step():
    w = torch.randn(40, 100, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 40)[:, None]
    q, scale = quant_linear.quantize(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (40,)
    assert int(q.abs().max()) <= 127
    assert (q.abs().amax(dim=1) == 127).all()  # every row uses the full range
    err = (quant_linear.dequantize(q, scale) - w).abs()
    assert (err <= scale[:, None] / 2 * (1 + 1e-5)).all()


def test_zero_rows_quantize_to_zero():
    w = torch.zeros(3, 16)
    w[1] = 1.0
    q, scale = quant_linear.quantize(w)
    assert torch.equal(quant_linear.dequantize(q, scale), w)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown quant_linear backend"):
        quant_linear.use_backend("nope")


def test_fast_backend_is_built_where_the_cpu_supports_it():
    import shutil

    if shutil.which("c++") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert "cpu_avx2" in quant_linear.available_backends()


@pytest.mark.parametrize("k,n", [(1536, 40), (200, 33), (13, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_how_many_are_computed_together(backend, k, n, dtype):
    """Batch invariance, bit for bit: verification computes k+1 rows in one call, plain decoding
    one row per call; an int8 target is speculated losslessly only if both give the same bits."""
    gen = torch.Generator().manual_seed(k + n)
    x = torch.randn(9, k, generator=gen).to(dtype)
    q, scale = quant_linear.quantize(torch.randn(n, k, generator=gen))
    b = torch.randn(n, generator=gen)
    alone = torch.cat([quant_linear.linear(x[i:i + 1], q, scale, b) for i in range(9)])
    for m in range(1, 10):
        together = quant_linear.linear(x[:m], q, scale, b)
        assert torch.equal(together, alone[:m]), m


@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 7, 13])
@pytest.mark.parametrize("k,n,bias", [(64, 48, True), (136, 24, False), (13, 8, True), (896, 72, False)])
def test_packed_weights_give_the_same_result(backend, m, k, n, bias):
    """Drafters hold their int8 weights packed in panels of 8 rows; the values must not change."""
    from kernels.linear.packing import pack

    gen = torch.Generator().manual_seed(m * 7 + k + n)
    x = torch.randn(m, k, generator=gen)
    q, scale = quant_linear.quantize(torch.randn(n, k, generator=gen))
    b = torch.randn(n, generator=gen) if bias else None
    got = quant_linear.linear(x, pack(q), scale, b)
    want = reference.linear(x, q, scale, b)
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
