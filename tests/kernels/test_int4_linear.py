"""int4 linear (int4 weights, int8-quantized inputs): every backend against the reference,
the quantizers' contracts, the panel layout, and batch invariance bit for bit."""
import pytest
import torch

from kernels import int4_linear
from kernels.int4_linear import reference
from tests.kernels.isa import VNNI_BY_DEFAULT, kernel_in_use, kernel_params

KERNELS = kernel_params(int4_linear.available_backends())


@pytest.fixture(params=int4_linear.available_backends())
def backend(request):
    previous = int4_linear.active_backend()
    int4_linear.use_backend(request.param)
    yield request.param
    int4_linear.use_backend(previous)


@pytest.fixture(params=KERNELS)
def kernel(request):
    with kernel_in_use(int4_linear, request.param, "int4_isa", "int4_allow_vnni") as param:
        yield param


def _layer(n, k, seed):
    gen = torch.Generator().manual_seed(seed)
    return int4_linear.quantize(torch.randn(n, k, generator=gen) * 0.05), gen


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 9, 13, 20])
@pytest.mark.parametrize("k,n,bias", [(32, 4, True), (96, 72, False), (1536, 36, True), (288, 8, False), (896, 132, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_matches_reference(kernel, m, k, n, bias, dtype):
    (packed, scale, offset), gen = _layer(n, k, m * 1000 + k + n)
    x = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen) if bias else None
    got = int4_linear.linear(x, packed, scale, offset, b)
    want = reference.linear(x, packed, scale, offset, b)
    assert got.shape == want.shape and got.dtype == dtype
    # The integer products are exact; the scaled fp32 sums differ in order only (and by one
    # final rounding for bf16). An input exactly between two int8 steps may round either way.
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * max(1.0, k / 256))


def test_close_to_the_float_layer(backend):
    """What the approximation costs: int4 weights and int8 inputs stay near the fp32 matmul."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 1536, generator=gen) * 0.03
    x = torch.randn(5, 1536, generator=gen)
    packed, scale, offset = int4_linear.quantize(w)
    exact = x @ w.t()
    got = int4_linear.linear(x, packed, scale, offset)
    rel = (got - exact).norm() / exact.norm()
    assert rel < 0.12, rel  # 4-bit weights: ~8% relative error on random weights


@pytest.mark.parametrize("k,n", [(1536, 40), (224, 12), (32, 4), (896, 44)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_how_many_are_computed_together(kernel, k, n, dtype):
    """Verification computes k+1 rows in one call, plain decoding one row per call: an int4
    target is speculated losslessly only if both give the same bits. Up to 20 rows: a prefill
    runs in chunks of rows (the VNNI tiles: 8)."""
    (packed, scale, offset), gen = _layer(n, k, k + n)
    x = torch.randn(20, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen)
    alone = torch.cat([int4_linear.linear(x[i:i + 1], packed, scale, offset, b) for i in range(20)])
    for m in range(1, 21):
        assert torch.equal(int4_linear.linear(x[:m], packed, scale, offset, b), alone[:m]), m
    # Rows computed after others in the same call: the same bits as alone.
    assert torch.equal(int4_linear.linear(x[4:9], packed, scale, offset, b), alone[4:9])


def test_leading_dimensions_are_kept(backend):
    packed, scale, offset = int4_linear.quantize(torch.randn(8, 64))
    assert int4_linear.linear(torch.randn(2, 3, 64), packed, scale, offset).shape == (2, 3, 8)


def test_quantization_error_is_at_most_half_a_step():
    w = torch.randn(40, 128, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 40)[:, None]
    packed, scale, offset = int4_linear.quantize(w)
    assert packed.dtype == torch.uint8 and packed.shape == (10, 4, 4, 16)
    assert scale.dtype == torch.float16 and scale.shape == (10, 4, 4)
    assert offset.dtype == torch.float16 and offset.shape == (40, 4)
    codes = reference.unpack(packed)
    assert codes.shape == (40, 128) and int(codes.max()) <= 15
    step = reference.row_scales(scale).repeat_interleave(32, dim=1)
    err = (int4_linear.dequantize(packed, scale, offset) - w).abs()
    assert (err <= step / 2 * (1 + 1e-4)).all()


def test_panels_hold_four_rows_interleaved_by_group():
    """Row r's group g lies at packed[r // 4, g, r % 4]: byte i = code i | code 16+i << 4."""
    w = torch.zeros(8, 64)
    w[5, 32:64] = torch.arange(32, dtype=torch.float32)  # row 5, group 1: codes 0..31 -> scale 31/15
    packed, scale, offset = int4_linear.quantize(w)
    block = packed[1, 1, 1]
    codes = torch.cat([block & 0x0F, block >> 4])
    assert scale[1, 1, 1] == pytest.approx(31 / 15, rel=2 ** -11)  # fp16
    assert torch.equal(codes, torch.round(torch.arange(32) / scale[1, 1, 1].float()).to(torch.uint8))
    assert torch.equal(reference.unpack(packed)[5, 32:], codes)


def test_constant_groups_are_exact():
    w = torch.full((4, 64), 0.25)
    w[2] = 0.0
    assert torch.equal(int4_linear.dequantize(*int4_linear.quantize(w)), w)


def test_input_quantization_rounds_half_to_even_per_group():
    x = torch.zeros(1, 64)
    x[0, 0] = 127.0  # group 0: dx = 1
    x[0, 1], x[0, 2], x[0, 3] = 2.5, 3.5, -2.5
    x[0, 32] = 0.5  # group 1: dx = 0.5/127
    xq, dx = reference.quantize_input(x)
    assert dx[0, 0] == 1.0 and xq[0, 1:4].tolist() == [2.0, 4.0, -2.0]
    assert xq[0, 32] == 127.0


def test_shapes_that_do_not_fit_are_refused():
    assert not reference.supports(6, 64) and not reference.supports(8, 48) and reference.supports(8, 64)
    with pytest.raises(ValueError, match="rows in fours"):
        int4_linear.quantize(torch.randn(6, 64))


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown int4_linear backend"):
        int4_linear.use_backend("nope")


def test_fast_backend_is_built_where_the_cpu_supports_it():
    import shutil

    if shutil.which("c++") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert "cpu_avx2" in int4_linear.available_backends()


def test_vnni_tiles_run_where_the_cpu_has_them():
    if "cpu_avx2" not in int4_linear.available_backends():
        pytest.skip("no compiled kernel on this CPU")
    from kernels.int4_linear import cpu_avx2
    assert cpu_avx2.int4_isa() == ("avx512_vnni" if VNNI_BY_DEFAULT else "avx2")
    from kernels.draft_decoder import cpu_avx2 as decoder
    assert decoder.int4_isa() == cpu_avx2.int4_isa()  # the drafter's and int4 targets' layers too


def test_the_kernel_report_names_the_int4_vnni_tiles_where_they_run():
    from kernels import cpu_kernel_report

    report = cpu_kernel_report()
    if int4_linear.active_backend() == "cpu_avx2" and VNNI_BY_DEFAULT:
        assert "int4 linear cpu_avx2 (AVX-512 VNNI)" in report
    else:
        assert "int4 linear cpu_avx2 (" not in report


def test_scales_are_fp16_and_never_zero():
    """A group whose range rounds to 0 in fp16 keeps scale 1 (its codes 0: w' = offset)."""
    w = torch.randn(4, 64) * 0.05
    w[1, :32] = 0.3 + torch.arange(32) * 1e-9  # a range far below fp16's smallest step
    packed, scale, offset = int4_linear.quantize(w)
    assert scale.dtype == torch.float16 and bool((scale > 0).all())
    back = int4_linear.dequantize(packed, scale, offset)
    assert torch.allclose(back[1, :32], w[1, :32], atol=1e-3)
    # 5 bits a weight: 16 bytes of codes, 2 of scale, 2 of offset per 32.
    assert packed.numel() + 2 * scale.numel() + 2 * offset.numel() == w.numel() * 5 // 8
