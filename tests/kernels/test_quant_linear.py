"""int8 weight-only linear: every backend against the reference, and the quantizer's contract."""

import pytest
import torch

from kernels import quant_linear
from kernels.quant_linear import reference
from tests.kernels.isa import VNNI_BY_DEFAULT, kernel_in_use, kernel_params


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


# int16 inputs (linear_a16, int8 targets): the inputs are quantized per 256 values, the
# products summed exactly in integers.

A16_KERNELS = kernel_params(quant_linear.available_backends())


@pytest.fixture(params=A16_KERNELS)
def a16_kernel(request):
    with kernel_in_use(quant_linear, request.param, "a16_isa", "a16_allow_vnni") as param:
        yield param


def _outlier_inputs(m, k, gen):
    """Inputs spanning four decades, as a transformer's activations do (a few large channels)."""
    return torch.randn(m, k, generator=gen) * torch.logspace(-2, 2, k)[torch.randperm(k, generator=gen)]


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13])
@pytest.mark.parametrize("k,n,bias", [(1536, 40, True), (4864, 23, False), (520, 33, False), (13, 7, True),
                                      (300, 16, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int16_input_backend_matches_reference(a16_kernel, m, k, n, bias, dtype):
    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    x = _outlier_inputs(m, k, gen).to(dtype)
    q, scale = quant_linear.quantize(torch.randn(n, k, generator=gen))
    b = torch.randn(n, generator=gen) if bias else None
    got = quant_linear.linear_a16(x, q, scale, b)
    want = reference.linear_a16(x, q, scale, b)
    assert got.shape == want.shape and got.dtype == dtype
    # Exact integer sums in both; only the fp32 sum over blocks runs in another order.
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())


@pytest.mark.parametrize("k", [1536, 300, 13])
def test_int16_inputs_stay_close_to_fp32_inputs(k):
    """The inputs' rounding (at most half of 1/32767 of their block's largest) moves the result
    far less than the weights' own int8 rounding does."""
    gen = torch.Generator().manual_seed(k)
    x = _outlier_inputs(5, k, gen)
    w = torch.randn(24, k, generator=gen)
    q, scale = quant_linear.quantize(w)
    exact = x @ w.t()
    fp32_inputs = reference.linear(x, q, scale)
    int16_inputs = reference.linear_a16(x, q, scale)
    weight_error = (fp32_inputs - exact).norm()
    input_error = (int16_inputs - fp32_inputs).norm()
    assert 0 < input_error < weight_error / 50


def test_int16_input_quantizer_rounds_each_block_on_its_own():
    x = torch.zeros(2, 600)
    x[0, :256] = torch.linspace(-3, 3, 256)
    x[0, 256:512] = 1e-3 * torch.linspace(-1, 1, 256)  # a quiet block keeps its own resolution
    x[1, 512:] = 7.0
    xq, s = reference.quantize_inputs(x)
    assert xq.dtype == torch.int16 and s.shape == (2, 3)
    assert int(xq.abs().max()) == 32767
    assert torch.allclose(s[0], torch.tensor([3.0, 1e-3, 0.0]) / 32767)
    assert torch.equal(s[1, :2], torch.zeros(2)) and (xq[1, 512:] == 32767).all()
    back = xq.float() * s.repeat_interleave(256, dim=1)[:, :600]
    assert ((back - x).abs() <= s.repeat_interleave(256, dim=1)[:, :600] / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("k,n", [(1536, 40), (4864, 23), (520, 33), (13, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int16_input_rows_do_not_depend_on_how_many_are_computed_together(a16_kernel, k, n, dtype):
    """Batch invariance of the int8 target's kernel, 1 to 20 rows (decoding, every verification
    tile shape, and the prefill path), for each tile set."""
    gen = torch.Generator().manual_seed(k + n)
    x = _outlier_inputs(20, k, gen).to(dtype)
    q, scale = quant_linear.quantize(torch.randn(n, k, generator=gen))
    b = torch.randn(n, generator=gen)
    alone = torch.cat([quant_linear.linear_a16(x[i:i + 1], q, scale, b) for i in range(20)])
    for m in range(1, 21):
        assert torch.equal(quant_linear.linear_a16(x[:m], q, scale, b), alone[:m]), m


def test_vnni_tiles_run_where_the_cpu_has_them():
    if "cpu_avx2" not in quant_linear.available_backends():
        pytest.skip("no compiled kernel on this CPU")
    from kernels.quant_linear import cpu_avx2
    assert cpu_avx2.a16_isa() == ("avx512_vnni" if VNNI_BY_DEFAULT else "avx2")


def test_the_kernel_report_names_the_vnni_tiles_where_they_run():
    from kernels import cpu_kernel_report

    report = cpu_kernel_report()
    from kernels import draft_decoder

    if quant_linear.active_backend() == "cpu_avx2" and VNNI_BY_DEFAULT:
        assert "int8 linear cpu_avx2 (AVX-512 VNNI)" in report
    else:
        assert "int8 linear cpu_avx2 (" not in report
    # The fused decoder layers (int8 targets' one-token steps) make the same choice.
    if draft_decoder.backends.active_name() == "cpu_avx2" and VNNI_BY_DEFAULT:
        assert "int8/int4 decoder layer cpu_avx2 (AVX-512 VNNI)" in report
    else:
        assert "decoder layer cpu_avx2 (" not in report
