"""torch's int4 / int8 weight-only kernels (kernels/int4pack) against the reference (the spec).

Here on the CPU through _weight_int4pack_mm_for_cpu and _weight_int8pack_mm; on a GPU or a Mac
the same tests also run the device ops (scripts/gpu_check.sh runs this file there). The CUDA /
MPS packed layout's size is checked everywhere through torch's meta kernels.
"""
import numpy as np
import pytest
import torch

from kernels import int4pack
from kernels.int4pack import reference, torch_ops
from kernels.int4pack.reference import GROUP, AffineInt4

HAS_CUDA = torch.cuda.is_available() and torch_ops.unsupported_reason("cuda") is None
HAS_MPS = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else []) + (["mps"] if HAS_MPS else [])
# CPU: every dtype the op takes; CUDA: bf16 only (its kernel reads nothing else); MPS: fp16, Tandem's.
DTYPES = {"cpu": [torch.bfloat16, torch.float16, torch.float32], "cuda": [torch.bfloat16], "mps": [torch.float16]}
CASES = [(d, t) for d in DEVICES for t in DTYPES[d]]
# K in 32s only (inner_k_tiles 2), in 64s (4), in 128s (8); N in 16s.
SHAPES = [(16, 32), (48, 96), (64, 64), (80, 160), (96, 192), (128, 256), (16, 384)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py says why


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``dtype`` at each |value| (fp32 tensor)."""
    mantissa = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]
    exponent = torch.floor(torch.log2(values.abs().clamp_min(2.0 ** -14)))
    return torch.pow(2.0, exponent - (mantissa - 1))


def assert_matches_reference(got: torch.Tensor, want_fp32: torch.Tensor, x: torch.Tensor, w: torch.Tensor):
    """The kernels accumulate in fp32 and round once to the dtype: allow that rounding (one ulp
    at the result, two at the boundary) and fp32 sums in another order (2^-20 of sum |x||w|)."""
    dtype = got.dtype
    bound = 2 * ulp(want_fp32, dtype) + 2.0 ** -20 * (x.float().abs() @ w.abs().t())
    err = (got.float() - want_fp32).abs()
    assert bool((err <= bound).all()), f"max error {err.max():.3g}, worst ratio {(err / bound).max():.2f}"


def random_affine(n: int, k: int, gen: torch.Generator) -> AffineInt4:
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scale = torch.rand(n, k // GROUP, generator=gen) * 0.02 + 1e-3
    offset = -scale * 7.5 + torch.randn(n, k // GROUP, generator=gen) * 0.01
    return AffineInt4(codes, scale, offset)


@pytest.mark.parametrize("device, dtype", CASES, ids=[f"{d}-{str(t)[6:]}" for d, t in CASES])
@pytest.mark.parametrize("n, k", SHAPES)
def test_int4_kernel_matches_the_dequantized_reference(device, dtype, n, k):
    gen = torch.Generator().manual_seed(n * 1000 + k)
    weights = random_affine(n, k, gen)
    packed = int4pack.pack(weights, device, dtype)
    assert packed.scales_zeros.shape == (k // GROUP, n, 2) and packed.dtype is dtype
    w = reference.dequantize(weights.codes, packed.scales_zeros.cpu())
    for m in range(1, 21):
        x = torch.randn(m, k, generator=gen).to(dtype)
        got = int4pack.linear(x.to(device), packed).cpu()
        assert got.shape == (m, n) and got.dtype is dtype
        assert_matches_reference(got, x.float() @ w.t(), x, w)


@pytest.mark.parametrize("device, dtype", CASES, ids=[f"{d}-{str(t)[6:]}" for d, t in CASES])
def test_bias_and_leading_dims(device, dtype):
    gen = torch.Generator().manual_seed(1)
    weights = random_affine(32, 64, gen)
    packed = int4pack.pack(weights, device, dtype)
    bias = torch.randn(32, generator=gen).to(dtype)
    x = torch.randn(2, 3, 64, generator=gen).to(dtype)
    got = int4pack.linear(x.to(device), packed, bias.to(device)).cpu()
    assert got.shape == (2, 3, 32) and got.dtype is dtype
    product = int4pack.linear(x.reshape(6, 64).to(device), packed).cpu()
    assert torch.equal(got.reshape(6, 32), product + bias)  # the bias is one add in the dtype
    w = reference.dequantize(weights.codes, packed.scales_zeros.cpu())
    assert_matches_reference(product, x.reshape(6, 64).float() @ w.t(), x.reshape(6, 64), w)
    fp32 = x.float().reshape(6, 64)
    assert int4pack.linear(fp32.to(device), packed).dtype is torch.float32  # cast for the call, back after


def test_cpu_kernels_are_batch_invariant():
    """Each row of a call equals that row computed alone, bit for bit: what lets speculation on
    a model with these layers equal its plain decoding (torch does not promise it; measured)."""
    gen = torch.Generator().manual_seed(2)
    for n, k in [(64, 256), (96, 160), (16, 32)]:
        weights = random_affine(n, k, gen)
        q, s = reference.quantize_int8(torch.randn(n, k, generator=gen))
        for dtype in DTYPES["cpu"]:
            packed = int4pack.pack(weights, "cpu", dtype)
            x = torch.randn(20, k, generator=gen).to(dtype)
            full, full8 = int4pack.linear(x, packed), int4pack.linear_int8(x, q, s.to(dtype))
            for m in range(1, 21):
                assert torch.equal(int4pack.linear(x[:m], packed), full[:m]), (n, k, dtype, m)
                assert torch.equal(int4pack.linear(x[m - 1:m], packed), full[m - 1:m]), (n, k, dtype, m)
                assert torch.equal(int4pack.linear_int8(x[m - 1:m], q, s.to(dtype)), full8[m - 1:m]), (n, k, dtype, m)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantize_holds_its_scale_and_zero_exactly(dtype):
    """Quantizing from float weights picks (s, z) the dtype holds, so torch's rounding changes
    nothing, and every weight is within half a step of its group's grid."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 256, generator=gen) * 0.05
    w[3, :32] = 0.25  # a constant group
    w[4, 32:64] = 0.0  # an all-zero one
    weights = int4pack.quantize(w, dtype)
    sz = reference.scales_and_zeros(weights.scale, weights.offset, dtype)
    assert torch.equal(reference.dequantize(weights.codes, sz), reference.dequantize_affine(weights))
    err = (reference.dequantize_affine(weights) - w).abs().reshape(64, 8, GROUP)
    step = weights.scale[..., None]
    assert bool((err <= step * 0.5 + step * 2.0 ** -6).all())
    assert torch.equal(reference.dequantize_affine(weights)[3, :32], w[3, :32])
    assert torch.equal(reference.dequantize_affine(weights)[4, 32:64], w[4, 32:64])


def q4_k_like(w: torch.Tensor) -> AffineInt4:
    """Q4_K's recipe in short: per 32 weights scale_j = range / 15 and min_j = -min(0, min);
    per 256 an fp16 d and dmin with 6-bit sc_j = scale_j / d and m_j = min_j / dmin; value =
    d * sc_j * q - dmin * m_j (llama.cpp also searches the scales; this is the format's shape)."""
    n, k = w.shape
    g = w.reshape(n, k // 256, 8, GROUP)
    lo = g.amin(-1).clamp(max=0)
    scale_j, min_j = (g.amax(-1) - lo) / 15, -lo
    d = (scale_j.amax(-1, keepdim=True) / 63).half().float()
    dmin = (min_j.amax(-1, keepdim=True) / 63).half().float()
    scale = d * torch.round(scale_j / d).clamp(1, 63)
    offset = -dmin * torch.round(min_j / dmin.clamp_min(1e-30)).clamp(0, 63)
    codes = torch.round((g - offset[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return AffineInt4(codes.reshape(n, k), scale.reshape(n, -1), offset.reshape(n, -1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_given_codes_move_by_at_most_the_rounding_of_s_and_z(dtype):
    """Given sub-blocks (scale = d * sc, offset = -dmin * m, 6-bit sc and m): torch's s and z in
    ``dtype`` round them once; any weight moves by at most 8 ulp(s) / 2 + ulp(z) / 2 (plus a
    fraction for fp32 arithmetic), whatever sc and m are."""
    gen = torch.Generator().manual_seed(4)
    n, k = 32, 256
    d, dmin = torch.rand(n, 1, generator=gen) * 1e-3, torch.rand(n, 1, generator=gen) * 1e-3
    sc = torch.randint(1, 64, (n, k // GROUP), generator=gen).float()
    mins = torch.randint(0, 64, (n, k // GROUP), generator=gen).float()
    given = AffineInt4(torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8), d * sc, -dmin * mins)
    sz = reference.scales_and_zeros(given.scale, given.offset, dtype)
    moved = (reference.dequantize(given.codes, sz) - reference.dequantize_affine(given)).abs().reshape(n, -1, GROUP)
    s, z = given.scale, given.offset + 8 * given.scale
    bound = 8 * ulp(s, dtype) / 2 + ulp(z, dtype) / 2
    assert bool((moved <= bound[..., None] * 1.01 + 1e-9).all())


@pytest.mark.parametrize("dtype, worst_step", [(torch.bfloat16, 0.05), (torch.float16, 0.01)])
def test_q4_k_like_sub_blocks_of_real_shaped_weights_move_a_small_fraction_of_a_step(dtype, worst_step):
    """In code steps the move is ~2^-9 (bf16) of |z| / s: for groups of weights around 0 |z| is
    a few steps and the move a few hundredths of a step; groups far from 0 against their range
    (rare in LLM weights) move more, up to the bound above."""
    w = torch.randn(64, 1024, generator=torch.Generator().manual_seed(8)) * 0.02
    given = q4_k_like(w)
    assert float((reference.dequantize_affine(given) - w).abs().max()) < float(given.scale.max())  # a sane grid
    sz = reference.scales_and_zeros(given.scale, given.offset, dtype)
    moved = (reference.dequantize(given.codes, sz) - reference.dequantize_affine(given)).abs().reshape(64, -1, GROUP)
    worst = float((moved.amax(-1) / given.scale).max())
    print(f"\n{dtype}: the worst weight moved {worst:.4f} of its group's step")
    assert worst < worst_step


def _q4_1_to_affine(blocks: np.ndarray, n: int, k: int) -> AffineInt4:
    """GGUF Q4_1 blocks (per 32: fp16 d, fp16 m, 16 bytes: code i low nibble, code 16 + i high)
    as the affine form: value = d * code + m."""
    raw = blocks.reshape(n, k // GROUP, 20)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = raw[..., 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, k)
    return AffineInt4(torch.from_numpy(codes.astype(np.uint8)), torch.from_numpy(d), torch.from_numpy(m))


def test_gguf_q4_1_blocks_are_taken_as_they_are():
    """A real GGUF 4-bit format (quantized and dequantized by gguf-py, the reference for GGUF):
    its codes go in unchanged; fp32 scales reproduce gguf's weights, bf16 ones within rounding."""
    from gguf import GGMLQuantizationType, quants

    n, k = 16, 128
    w = np.random.default_rng(5).standard_normal((n, k)).astype(np.float32) * 0.05
    blocks = quants.quantize(w, GGMLQuantizationType.Q4_1)
    expected = torch.from_numpy(quants.dequantize(blocks, GGMLQuantizationType.Q4_1).reshape(n, k))
    given = _q4_1_to_affine(np.asarray(blocks), n, k)
    assert torch.equal(reference.dequantize_affine(given), expected)
    exact = reference.dequantize(given.codes, reference.scales_and_zeros(given.scale, given.offset, torch.float32))
    torch.testing.assert_close(exact, expected, rtol=0, atol=2e-7)
    x = torch.randn(3, k)
    packed = int4pack.pack(given, "cpu", torch.float32)
    assert_matches_reference(int4pack.linear(x, packed), x @ exact.t(), x, exact)
    bf16 = reference.dequantize(given.codes, reference.scales_and_zeros(given.scale, given.offset, torch.bfloat16))
    assert float(((bf16 - expected).abs().reshape(n, -1, GROUP).amax(-1) / given.scale).max()) < 0.04


def test_shapes_that_do_not_fit_are_refused():
    assert int4pack.supports(16, 32) and int4pack.supports(4096, 14336)
    assert not int4pack.supports(387, 64)  # N not in 16s (a tiny vocabulary)
    assert not int4pack.supports(24, 64)  # CUDA / MPS would take it, the CPU op not: one rule
    assert not int4pack.supports(64, 100)  # K not in 32s
    with pytest.raises(ValueError, match="N in 16s and K in 32s"):
        int4pack.pack(AffineInt4(torch.zeros(24, 64, dtype=torch.uint8), torch.ones(24, 2), torch.zeros(24, 2)), "cpu")
    with pytest.raises(ValueError, match="K = 100"):
        int4pack.quantize(torch.randn(8, 100))
    with pytest.raises(ValueError, match="K/32"):
        AffineInt4(torch.zeros(8, 64, dtype=torch.uint8), torch.ones(8, 3), torch.zeros(8, 3))
    assert [reference.inner_k_tiles(k) for k in (32, 64, 96, 128, 4096)] == [2, 4, 2, 8, 8]


@pytest.mark.parametrize("n, k", [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (151936, 1536), (256, 96)])
def test_packed_bytes_are_five_bits_a_weight_on_every_device_layout(n, k):
    """What the memory fit budgets (INT4PACK_BYTES_PER_WEIGHT): half a byte of codes and a
    16-bit scale and zero per 32. The CUDA / MPS layout's size comes from torch's meta kernel
    (the shape those devices allocate), the CPU's from a real pack."""
    from engine.models.planning.memory_fit import INT4PACK_BYTES_PER_WEIGHT

    nibbles = torch.empty(n, k // 2, dtype=torch.uint8, device="meta")
    device_layout = torch.ops.aten._convert_weight_to_int4pack(nibbles, reference.inner_k_tiles(k))
    assert device_layout.dtype == torch.int32 and device_layout.shape[0] == n // 8  # 8-row tiles
    scales = (k // GROUP) * n * 2 * 2
    assert (device_layout.numel() * 4 + scales) / (n * k) == INT4PACK_BYTES_PER_WEIGHT == 0.625
    if n * k <= 4096 * 4096:
        codes = torch.empty(n, k, dtype=torch.int32, device="meta")
        assert torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 8).nbytes == n * k // 2
    small = int4pack.pack(random_affine(64, k, torch.Generator().manual_seed(6)), "cpu")
    assert small.nbytes / (64 * k) == INT4PACK_BYTES_PER_WEIGHT


def test_nibble_order_for_the_device_ops():
    """CUDA / MPS take column 2i in the high nibble of byte i (ATen int4mm.cu's layout note,
    torchao's packing); a mistake here would swap every pair of weights on those devices."""
    codes = torch.tensor([[1, 2, 3, 4, 15, 0, 7, 8]], dtype=torch.uint8)
    assert torch_ops.pack_nibbles(codes).tolist() == [[0x12, 0x34, 0xF0, 0x78]]


@pytest.mark.parametrize("device, dtype", CASES, ids=[f"{d}-{str(t)[6:]}" for d, t in CASES])
def test_int8_kernel_matches_the_dequantized_reference(device, dtype):
    gen = torch.Generator().manual_seed(7)
    for n, k in [(32, 64), (96, 256), (64, 96)]:
        w = torch.randn(n, k, generator=gen)
        q, s = int4pack.quantize_int8(w, dtype)
        assert q.dtype == torch.int8 and s.dtype is dtype
        wq = reference.dequantize_int8(q, s)
        assert float(((wq - w).abs().amax(1) / (w.abs().amax(1) / 127)).max()) <= 0.5 + 2 ** -6
        for m in (1, 5, 20):
            x = torch.randn(m, k, generator=gen).to(dtype)
            got = int4pack.linear_int8(x.to(device), q.to(device), s.to(device)).cpu()
            assert_matches_reference(got, x.float() @ wq.t(), x, wq)


def test_device_dtypes_and_reasons():
    assert torch_ops.device_dtype("cuda") is torch.bfloat16 and torch_ops.device_dtype("mps") is torch.float16
    assert torch_ops.unsupported_reason("cpu") is None
    assert "no int4 weight kernel" in torch_ops.unsupported_reason("meta")
    if not torch.cuda.is_available():
        assert torch_ops.unsupported_reason("cuda") == "no CUDA device"
    assert int4pack.int8_supports(387, 64, "cpu") and not int4pack.int8_supports(387, 64, "mps")
