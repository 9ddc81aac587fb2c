"""GGUF-native linear: dequantize bit for bit as gguf-py's numpy reference (random blocks and the
default pair's real tensors), the reference linear's contract, and every compiled tile set
(AVX2, AVX-512 VNNI, AMX-INT8 where the CPU and OS have them) against the reference, bit for
bit, for every supported type and 1..20 rows."""
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from kernels import gguf_linear
from kernels.gguf_linear import blocks, reference
from tests.kernels.isa import kernel_in_use, kernel_params

TYPES = list(gguf_linear.SUPPORTED_TYPES)
# Types gguf-py can quantize itself (it only dequantizes the K-quants).
QUANTIZABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# Where each type keeps its fp16 scales, by byte offset in a block.
FP16_FIELDS = {T.Q4_0: (0,), T.Q5_0: (0,), T.Q8_0: (0,), T.Q4_1: (0, 2), T.Q5_1: (0, 2), T.Q4_K: (0, 2),
               T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_raw(qtype, n, k, seed, scale=0.01):
    """Random bytes in every field, with finite fp16 scales (as a real file has)."""
    rng = np.random.default_rng(seed)
    values, size = blocks.block_shape(qtype)
    raw = rng.integers(0, 256, size=(n, k // values, size), dtype=np.uint8)
    for at in FP16_FIELDS[qtype]:
        half = (rng.standard_normal(raw.shape[:2]) * scale).astype(np.float16)
        raw[..., at:at + 2] = half.view(np.uint8).reshape(*raw.shape[:2], 2)
    return torch.from_numpy(raw.reshape(n, -1))


def bits_equal(a, b) -> bool:
    a, b = np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_random_blocks_bit_identical_to_gguf(qtype):
    n, k = 9, blocks.block_shape(qtype)[0] * 5
    raw = random_raw(qtype, n, k, seed=int(qtype))
    want = quants.dequantize(raw.numpy(), qtype)
    assert bits_equal(gguf_linear.dequantize(raw, qtype, n, k), want)


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_dequantize_quantized_data_bit_identical_to_gguf(qtype):
    data = np.random.default_rng(1).standard_normal((12, 256)).astype(np.float32)
    data[3] = 0.0  # a zero block: scale 0
    raw = quants.quantize(data, qtype)
    got = gguf_linear.dequantize(torch.from_numpy(raw), qtype, 12, 256)
    assert bits_equal(got, quants.dequantize(raw, qtype))
    assert (got - torch.from_numpy(data)).abs().max() < 0.5  # and it is the data, roughly


def _default_pair_ggufs() -> list[Path]:
    # Resolved at import, before the per-test home isolation: the files are only read.
    from engine.core.paths import cache_dir
    from engine.models.loading.default_pair import DRAFTER, TARGET

    return [cache_dir() / "gguf" / spec.filename for spec in (TARGET, DRAFTER)]


GGUFS = _default_pair_ggufs()


@pytest.mark.slow  # ~20 s a file (gguf-py reads the metadata, the vocabulary included, in Python)
@pytest.mark.parametrize("path", GGUFS, ids=lambda p: p.name)
def test_dequantize_real_tensors_bit_identical_to_gguf(path):
    """Every quantized tensor of the default pair's files (its first 48 rows: the decoding is
    the same for every row, and the whole files would take minutes in numpy)."""
    if not path.exists():
        pytest.skip(f"{path.name} not downloaded")
    import gguf

    seen = set()
    for tensor in gguf.GGUFReader(path).tensors:
        if tensor.tensor_type not in gguf_linear.SUPPORTED_TYPES:
            continue
        rows = np.asarray(tensor.data[:48])
        k = int(tensor.shape[0])
        got = gguf_linear.dequantize(torch.from_numpy(rows.copy()), tensor.tensor_type, rows.shape[0], k)
        assert bits_equal(got, quants.dequantize(rows, tensor.tensor_type)), tensor.name
        seen.add(tensor.tensor_type)
    assert seen  # the file has quantized tensors of supported types


def test_prepare_checks_the_shape_and_keeps_the_bytes():
    raw = random_raw(T.Q4_K, 4, 512, seed=0)
    w = gguf_linear.prepare(raw, T.Q4_K, 4, 512)
    assert w.raw.data_ptr() == raw.data_ptr() and w.qtype == T.Q4_K and (w.n, w.k) == (4, 512)
    with pytest.raises(ValueError, match="needs raw uint8"):
        gguf_linear.prepare(raw, T.Q4_K, 4, 768)
    with pytest.raises(ValueError, match="multiples of 256"):
        gguf_linear.prepare(raw, T.Q4_K, 4, 500)
    with pytest.raises(ValueError, match="not supported"):
        gguf_linear.prepare(raw, T.Q2_K, 4, 512)


def test_prepare_shares_a_read_only_memory_map(tmp_path):
    """As gguf.GGUFReader gives a tensor: a numpy memmap of the file, read-only. No copy, no
    warning (nothing ever writes to the weights)."""
    import warnings

    raw = random_raw(T.Q6_K, 4, 512, seed=2).numpy()
    path = tmp_path / "weights.bin"
    raw.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=raw.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = gguf_linear.prepare(mapped, T.Q6_K, 4, 512)
    assert w.raw.data_ptr() == mapped.ctypes.data
    x = torch.randn(2, 512)
    assert torch.equal(gguf_linear.linear(x, w), reference.linear(x, torch.from_numpy(raw), T.Q6_K, 4, 512))


def test_input_quantization_contract():
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    x[1, 256:] = 0.0  # a zero block
    xq, dx, xs = reference.quantize_input(x, 256)
    assert xq.dtype == torch.int8 and dx.shape == (3, 2) and xs.shape == (3, 16)
    assert int(xq.abs().max()) == 127 and dx[1, 1] == 0 and not xq[1, 256:].any()
    assert torch.equal(xs, xq.reshape(3, 16, 32).sum(-1, dtype=torch.int32))
    err = (xq.float() * dx.repeat_interleave(256, dim=1) - x).abs()
    assert (err <= dx.repeat_interleave(256, dim=1) / 2 * 1.0001).all()  # within half a step


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_reference_is_close_to_the_dequantized_matmul(qtype):
    """What quantizing the inputs costs: int8 per block stays within ~1% of the float matmul."""
    n, k = 40, 1024
    raw = random_raw(qtype, n, k, seed=5)
    x = torch.randn(6, k, generator=torch.Generator().manual_seed(6))
    exact = x.double() @ gguf_linear.dequantize(raw, qtype, n, k).double().t()
    got = reference.linear(x, raw, qtype, n, k)
    assert float((got.double() - exact).norm() / exact.norm()) < 0.02


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_reference_rows_are_independent(qtype):
    n, k = 12, 512
    raw = random_raw(qtype, n, k, seed=7)
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(8))
    b = torch.randn(n)
    together = reference.linear(x, raw, qtype, n, k, b)
    alone = torch.cat([reference.linear(x[i:i + 1], raw, qtype, n, k, b) for i in range(7)])
    assert torch.equal(together, alone)


def _amx_runs() -> bool:
    """Whether the compiled backend's AMX tiles run here (the CPU has AMX-INT8 and the OS lets
    this process use the tiles)."""
    if "cpu_avx2" not in gguf_linear.available_backends():
        return False
    from kernels.gguf_linear import cpu_avx2

    before = cpu_avx2.gguf_isa()
    cpu_avx2.gguf_allow_vnni(True)
    cpu_avx2.gguf_allow_amx(True)
    runs = cpu_avx2.gguf_isa() == "amx_int8"
    cpu_avx2.gguf_allow_vnni(before != "avx2")
    cpu_avx2.gguf_allow_amx(before != "avx512_vnni")
    return runs


HAS_AMX = _amx_runs()
COMPILED = [p for p in kernel_params(gguf_linear.available_backends()) if p != "reference"] + (
    ["cpu_avx2/amx_int8"] if HAS_AMX else [])
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="no AMX-INT8 tiles here (CPU or OS)")


@pytest.fixture(params=COMPILED or [pytest.param("cpu_avx2", marks=pytest.mark.skip(reason="no compiled backend here"))])
def kernel(request):
    """The compiled backend on each tile set this CPU has ("cpu_avx2": AVX2 tiles,
    "cpu_avx2/avx512_vnni": AVX-512 VNNI tiles, "cpu_avx2/amx_int8": those plus AMX tiles for
    Q4_K / Q6_K against many rows)."""
    with kernel_in_use(gguf_linear, request.param, "gguf_isa", "gguf_allow_vnni", "gguf_allow_amx") as param:
        yield param


@pytest.fixture
def amx_for_every_row_count():
    """The AMX tiles on, and taking Q4_K / Q6_K from 2 input rows on (not only from where they
    pay), so that every row count runs on them; the VNNI tiles for comparison come with
    ``gguf_allow_amx(False)``."""
    from kernels.gguf_linear import cpu_avx2

    with kernel_in_use(gguf_linear, "cpu_avx2/amx_int8", "gguf_isa", "gguf_allow_vnni", "gguf_allow_amx"):
        was = cpu_avx2.gguf_amx_rows(2)
        try:
            yield cpu_avx2
        finally:
            cpu_avx2.gguf_amx_rows(was)
            cpu_avx2.gguf_allow_amx(True)


def _inputs(m, k, seed):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    x[3] = 0.0  # a zero row: every block's scale 0
    x[5, :32] = 0.0  # a zero block
    x[6] *= 1e4  # a large row
    x[7, 1] = 50.0  # one outlier dominates its block's scale
    return x


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n,k", [(13, 512), (40, 1536)])
def test_compiled_tiles_match_the_reference_bit_for_bit(kernel, qtype, n, k):
    """Every row count 1..20 (so every tile shape and chunking of the rows), bit for bit: the
    integer sums are exact and the fp32 steps are the reference's, so the bits must agree. That
    every prefix of the rows agrees with one reference call is batch invariance."""
    if k % blocks.block_shape(qtype)[0]:
        pytest.skip("row width not a whole number of blocks")
    raw = random_raw(qtype, n, k, seed=n + k + int(qtype))
    w = gguf_linear.prepare(raw, qtype, n, k)
    x, bias = _inputs(20, k, seed=n), torch.randn(n)
    want = reference.linear(x, raw, qtype, n, k, bias)
    assert qtype in gguf_linear.fast_types()
    for m in range(1, 21):
        assert torch.equal(gguf_linear.linear(x[:m], w, bias), want[:m]), m
    # Rows computed after others in the same call; no bias; bf16 inputs.
    assert torch.equal(gguf_linear.linear(x[4:9], w, bias), want[4:9])
    assert torch.equal(gguf_linear.linear(x[:7], w), reference.linear(x[:7], raw, qtype, n, k))
    xb = x[:9].to(torch.bfloat16)
    assert torch.equal(gguf_linear.linear(xb, w, bias), reference.linear(xb, raw, qtype, n, k, bias))


def test_a_group_of_weights_in_one_call_gives_each_weights_reference_bits(kernel):
    """linear_group: every type at once on one input (K-quants and legacy types, so every input
    layout), with and without biases, odd widths, 1..20 rows: each weight's outputs are the
    reference's bits, side by side in the group's order."""
    k = 512
    weights, raws, biases = [], [], []
    for i, qtype in enumerate(TYPES):
        n = 5 + 3 * i  # widths that leave partial tiles
        raw = random_raw(qtype, n, k, seed=100 + i)
        raws.append(raw)
        weights.append(gguf_linear.prepare(raw, qtype, n, k))
        biases.append(torch.randn(n) if i % 2 == 0 else None)
    x = _inputs(20, k, seed=7)
    want = torch.cat([reference.linear(x, raw, w.qtype, w.n, k, b) for raw, w, b in zip(raws, weights, biases)], dim=-1)
    assert len(weights) == 8  # the most one call takes
    first = weights
    for m in range(1, 21):
        assert torch.equal(gguf_linear.linear_group(x[:m], weights, biases), want[:m]), m
    # One weight alone is linear(); no biases given is no bias for any.
    assert torch.equal(gguf_linear.linear_group(x[:3], weights[:1], biases[:1]), gguf_linear.linear(x[:3], weights[0], biases[0]))
    plain = torch.cat([gguf_linear.linear(x[:4], w) for w in first], dim=-1)
    assert torch.equal(gguf_linear.linear_group(x[:4], first), plain)
    with pytest.raises(ValueError, match="input width"):
        gguf_linear.linear_group(torch.randn(2, 256), first)
    with pytest.raises(ValueError, match="a bias"):
        gguf_linear.linear_group(x[:2], first, biases[:2])


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_prompt_chunks_give_the_bits_of_one_row_at_a_time(kernel, qtype):
    """Many rows at once (a prefill chunk: on VNNI, tiles of 16 weight rows, each block laid out
    once for all rows) give each row the bits it gets alone, for row counts on both sides of
    where those tiles take over (6) and with a partial last tile of weight rows; alone and in a
    group beside a type those tiles do not cover."""
    n, k = 37, 768
    raw = random_raw(qtype, n, k, seed=int(qtype))
    w = gguf_linear.prepare(raw, qtype, n, k)
    x, bias = _inputs(70, k, seed=11), torch.randn(n)
    alone = torch.cat([gguf_linear.linear(x[i : i + 1], w, bias) for i in range(70)])
    for m in (5, 6, 7, 11, 12, 13, 16, 33, 70):
        assert torch.equal(gguf_linear.linear(x[:m], w, bias), alone[:m]), m
    assert torch.equal(gguf_linear.linear(x[:20], w), reference.linear(x[:20], raw, qtype, n, k))
    other = gguf_linear.prepare(random_raw(T.Q5_K, 9, k, seed=2), T.Q5_K, 9, k)
    pair = gguf_linear.linear_group(x[:40], [w, other], [bias, None])
    assert torch.equal(pair[:, :n], alone[:40])
    assert torch.equal(pair[:, n:], torch.cat([gguf_linear.linear(x[i : i + 1], other) for i in range(40)]))


def test_compiled_backend_covers_every_type(kernel):
    assert set(gguf_linear.fast_types()) == set(TYPES)
    # The tile set in the name comes from the compiled module's isa query.
    detail = {"avx512_vnni": " (AVX-512 VNNI)", "amx_int8": " (AVX-512 VNNI, AMX-INT8)"}.get(kernel.partition("/")[2], "")
    assert gguf_linear.backend_name() == "gguf linear cpu_avx2" + detail


@needs_amx
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n,k", [(37, 768), (16, 256), (50, 2048)])
def test_amx_tiles_give_the_vnni_and_reference_bits(amx_for_every_row_count, qtype, n, k):
    """AMX tiles (the weights' codes times their scales in base-256 digits, 16 input rows a
    tile, fewer padded with zeros, a last partial chunk overlapping the one before) against the
    VNNI tiles and the reference, bit for bit, for every row count 1..20 and a prompt-sized 256:
    the integers are exact, so the bits must agree whichever tiles ran and however many rows
    shared the call."""
    cpu_avx2 = amx_for_every_row_count
    raw = random_raw(qtype, n, k, seed=n * k + int(qtype))
    w = gguf_linear.prepare(raw, qtype, n, k)
    x, bias = _inputs(256, k, seed=k), torch.randn(n)
    x[40:48] = torch.randn(8, k) * 1e-3  # small rows: their own scales
    want = reference.linear(x, raw, qtype, n, k, bias)
    for m in [*range(1, 21), 33, 256]:
        cpu_avx2.gguf_allow_amx(True)
        assert cpu_avx2.gguf_isa() == "amx_int8"
        got = gguf_linear.linear(x[:m], w, bias)
        assert torch.equal(got, want[:m]), m
        cpu_avx2.gguf_allow_amx(False)
        assert torch.equal(gguf_linear.linear(x[:m], w, bias), got), m
    cpu_avx2.gguf_allow_amx(True)
    assert torch.equal(gguf_linear.linear(x[100:117], w), reference.linear(x[100:117], raw, qtype, n, k))


@needs_amx
def test_amx_tiles_in_a_group_beside_other_types(amx_for_every_row_count):
    """linear_group on the AMX tiles: Q4_K and Q6_K weights (one Q4_K with a partial tile of
    rows) beside the types they leave to the VNNI tiles, each weight's bits as linear() gives
    them on the VNNI tiles alone."""
    cpu_avx2 = amx_for_every_row_count
    k = 512
    specs = [(T.Q4_K, 35), (T.Q6_K, 16), (T.Q5_K, 9), (T.Q8_0, 7), (T.Q4_K, 64)]
    weights = [gguf_linear.prepare(random_raw(q, n, k, seed=30 + i), q, n, k) for i, (q, n) in enumerate(specs)]
    biases = [torch.randn(n) if i % 2 else None for i, (_, n) in enumerate(specs)]
    x = _inputs(40, k, seed=9)
    for m in (1, 3, 9, 16, 17, 40):
        cpu_avx2.gguf_allow_amx(False)
        want = torch.cat([gguf_linear.linear(x[:m], w, b) for w, b in zip(weights, biases)], dim=-1)
        cpu_avx2.gguf_allow_amx(True)
        assert torch.equal(gguf_linear.linear_group(x[:m], weights, biases), want), m


def test_amx_tiles_switch_off(kernel):
    """gguf_allow_amx(False) (or TANDEM_AMX=0 / TANDEM_AVX512=0 in the environment) leaves the
    VNNI tiles, which is what gguf_isa reports; nothing changes where AMX does not run."""
    from kernels.gguf_linear import cpu_avx2

    if not kernel.startswith("cpu_avx2"):
        pytest.skip("the compiled backend only")
    cpu_avx2.gguf_allow_amx(False)
    try:
        assert cpu_avx2.gguf_isa() in ("avx2", "avx512_vnni")
    finally:
        cpu_avx2.gguf_allow_amx(kernel.endswith("/amx_int8") or not kernel.endswith("/avx512_vnni"))
    assert cpu_avx2.gguf_isa() == (kernel.partition("/")[2] or "avx2")


# A group's super-block, packed: 8 rows for the AVX2 tiles, 16 for the VNNI tiles.
GROUP_BYTES = {"cpu_avx2": (8, {T.Q4_K: 1184, T.Q6_K: 1680}), "cpu_avx2/avx512_vnni": (16, {T.Q4_K: 2368, T.Q6_K: 3392})}


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_k_quants_laid_out_again_keep_their_bits(kernel, qtype):
    """Where the AVX2 tiles run, ``prepare`` makes Q4_K's and Q6_K's interleaved copies in groups
    of 8 rows, where the VNNI tiles run in groups of 16 (a partial last group either way), and no
    other type's; computing from them gives the file layout's bits and the reference's, for every
    row count (every tile shape and chunking, the rows kept in registers and those through the
    prefill tiles), alone and in a group beside other types. Where AMX tiles run no copy is made
    (they read the file's rows)."""
    from kernels.gguf_linear import cpu_avx2

    if not kernel.startswith("cpu_avx2"):
        pytest.skip("the compiled backend only")
    n, k = 37, 768
    raw = random_raw(qtype, n, k, seed=41 + int(qtype))
    w = gguf_linear.prepare(raw, qtype, n, k)
    others = [gguf_linear.prepare(random_raw(t, 11, k, seed=int(t)), t, 11, k) for t in (T.Q5_K, T.Q5_0)]
    if kernel not in GROUP_BYTES:
        assert w.packed is None
        return
    rows, group_bytes = GROUP_BYTES[kernel]
    assert w.packed is not None and w.packed.numel() == -(-n // rows) * 3 * group_bytes[qtype]  # 3 blocks
    assert all(o.packed is None for o in others)
    x, bias = _inputs(20, k, seed=5), torch.randn(n)
    want = reference.linear(x, raw, qtype, n, k, bias)
    want_unbiased = reference.linear(x, raw, qtype, n, k)
    cpu_avx2.gguf_allow_packed(False)
    try:
        file_layout = [gguf_linear.linear(x[:m], w, bias) for m in range(1, 21)]
        group_file = gguf_linear.linear_group(x, [others[0], w, others[1]], [None, bias, None])
    finally:
        cpu_avx2.gguf_allow_packed(True)
    for m in range(1, 21):
        packed = gguf_linear.linear(x[:m], w, bias)
        assert torch.equal(packed, file_layout[m - 1]) and torch.equal(packed, want[:m]), m
    for m in (1, 2, 5, 6, 7, 20):  # beside a type on the tiles of 8, and the same weight from its file
        group = gguf_linear.linear_group(x[:m], [others[0], w, others[1], gguf_linear.GgufWeight(raw, qtype, n, k)],
                                         [None, bias, None, None])
        assert torch.equal(group[:, :11 + n + 11], group_file[:m]) and torch.equal(group[:, 11:11 + n], want[:m]), m
        assert torch.equal(group[:, 11 + n + 11:], want_unbiased[:m]), m
    # Many rows (a prefill chunk) too.
    many = _inputs(70, k, seed=6)
    assert torch.equal(gguf_linear.linear(many, w), reference.linear(many, raw, qtype, n, k))
    # A copy that is not this weight's is refused, not read past its end.
    short = gguf_linear.GgufWeight(raw, qtype, n, k, w.packed[:1])
    with pytest.raises(RuntimeError, match="pack"):
        gguf_linear.linear(x[:1], short)


def test_a_copy_laid_out_for_other_tiles_is_not_read(kernel):
    """Tests switch tile sets in one process: a weight packed for the AVX2 tiles and one packed for
    the VNNI tiles are each read only by their own; the other computes from the file's rows, with
    the same bits."""
    from kernels.gguf_linear import cpu_avx2

    if kernel != "cpu_avx2/avx512_vnni":
        pytest.skip("needs the VNNI tiles beside the AVX2 ones")
    n, k = 32, 512
    raw = random_raw(T.Q4_K, n, k, seed=7)
    vnni_copy = gguf_linear.prepare(raw, T.Q4_K, n, k)
    cpu_avx2.gguf_allow_vnni(False)
    try:
        avx2_copy = gguf_linear.prepare(raw, T.Q4_K, n, k)
    finally:
        cpu_avx2.gguf_allow_vnni(True)
    # Same bytes per row (2,368 per 16 rows, 1,184 per 8): only the layout tells them apart.
    assert vnni_copy.packed.numel() == avx2_copy.packed.numel()
    x = _inputs(9, k, seed=8)
    want = reference.linear(x, raw, T.Q4_K, n, k)
    for m in (1, 5, 9):
        assert torch.equal(gguf_linear.linear(x[:m], avx2_copy), want[:m])
        cpu_avx2.gguf_allow_vnni(False)
        try:
            assert torch.equal(gguf_linear.linear(x[:m], vnni_copy), want[:m])
        finally:
            cpu_avx2.gguf_allow_vnni(True)


def test_leading_dimensions_and_dtype_are_kept():
    raw = random_raw(T.Q4_K, 8, 256, seed=1)
    w = gguf_linear.prepare(raw, T.Q4_K, 8, 256)
    y = gguf_linear.linear(torch.randn(2, 3, 256), w)
    assert y.shape == (2, 3, 8) and y.dtype == torch.float32
    with pytest.raises(ValueError, match="input width"):
        gguf_linear.linear(torch.randn(2, 512), w)


@pytest.mark.slow  # gguf-py reads each file's metadata in Python (~20 s a file)
@pytest.mark.parametrize("path", GGUFS, ids=lambda p: p.name)
def test_compiled_tiles_match_the_reference_on_real_tensors(kernel, path):
    """One tensor of each type in the file (its first 64 rows), 5 and 1 input rows."""
    if not path.exists():
        pytest.skip(f"{path.name} not downloaded")
    import gguf

    done = set()
    for tensor in gguf.GGUFReader(path).tensors:
        qtype = tensor.tensor_type
        if qtype not in gguf_linear.SUPPORTED_TYPES or qtype in done or len(tensor.shape) != 2:
            continue
        k = int(tensor.shape[0])
        raw = torch.from_numpy(np.asarray(tensor.data[:64]).copy())
        w = gguf_linear.prepare(raw, qtype, 64, k)
        x = torch.randn(5, k, generator=torch.Generator().manual_seed(0))
        want = reference.linear(x, raw, qtype, 64, k)
        assert torch.equal(gguf_linear.linear(x, w), want), tensor.name
        assert torch.equal(gguf_linear.linear(x[2:3], w), want[2:3]), tensor.name
        done.add(qtype)
    assert done
