"""The attention backends against the reference, and the batch invariance the target relies on."""
import pytest
import torch

from kernels import attention
from kernels.attention import reference
from tests.kernels.isa import HAS_VNNI, kernel_in_use, kernel_params


@pytest.fixture(params=kernel_params(attention.available_backends()))
def backend(request):
    """Each backend, the compiled one on each tile set this CPU has ("cpu_avx2": 8-lane partials,
    "cpu_avx2/avx512_vnni": 16-lane ones); afterwards what the import chose, so later tests see
    the real backend."""
    with kernel_in_use(attention, request.param, "attention_isa", "attention_allow_avx512") as param:
        yield param.partition("/")[0]


def _qkv(heads, kv_heads, rows, length, dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, rows, dim, generator=gen).to(dtype)
    k = torch.randn(1, kv_heads, length, dim, generator=gen).to(dtype)
    v = torch.randn(1, kv_heads, length, dim, generator=gen).to(dtype)
    return q, k, v


def _naive(q, k, v, scaling):
    """Textbook masked softmax attention in float64: what both backends approximate."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    rows, length = q.shape[2], k.shape[2]
    scores = (q.double() @ k.transpose(2, 3)) * scaling
    mask = torch.ones(rows, length, dtype=torch.bool).tril(length - rows)
    out = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    return out.transpose(1, 2)


@pytest.mark.parametrize("heads,kv_heads,rows,length,dim", [(4, 4, 1, 1, 8), (12, 2, 7, 90, 128), (6, 2, 3, 13, 64), (2, 1, 9, 9, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_matches_textbook_attention(backend, heads, kv_heads, rows, length, dim, dtype):
    q, k, v = _qkv(heads, kv_heads, rows, length, dim, dtype)
    got = attention.causal_attention(q, k, v, dim ** -0.5)
    assert got.shape == (1, rows, heads, dim) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), _naive(q, k, v, dim ** -0.5), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_how_many_are_computed_together(backend, dtype):
    """Row i of a k+1-row verification equals a one-row decoding step at the same position, bit for
    bit, also when the cache is a cropped view (as after a rejected draft)."""
    q, k, v = _qkv(12, 2, 9, 140, 128, dtype, seed=3)
    k, v = k[:, :, :100], v[:, :, :100]  # a view with the longer cache's strides
    rows = 9
    together = attention.causal_attention(q, k, v, 0.088)
    for i in range(rows):
        visible = 100 - rows + i + 1
        alone = attention.causal_attention(q[:, :, i : i + 1], k[:, :, :visible], v[:, :, :visible], 0.088)
        assert torch.equal(alone[:, 0], together[:, i]), i


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention.use_backend("nope")


def test_reference_is_the_specification():
    q, k, v = _qkv(4, 2, 5, 20, 16, torch.float32, seed=5)
    torch.testing.assert_close(reference.causal_attention(q, k, v, 0.25).double(), _naive(q, k, v, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows,length", [(1, 1100), (5, 4100), (300, 700), (256, 256), (3, 512)])
def test_long_caches_match_textbook_attention(backend, rows, length):
    """Several key chunks (partial softmaxes merged in order), prefill-sized row counts."""
    q, k, v = _qkv(12, 2, rows, length, 128, torch.float32, seed=11)
    got = attention.causal_attention(q, k, v, 128 ** -0.5)
    torch.testing.assert_close(got.double(), _naive(q, k, v, 128 ** -0.5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16])
def test_sixteen_bit_cache_matches_textbook_attention(backend, kv_dtype):
    """fp32 queries against a 16-bit cache: the rounding is the cache's, the arithmetic fp32."""
    if backend == "reference":
        pytest.skip("the reference takes one dtype")
    q, k, v = _qkv(12, 2, 5, 600, 128, torch.float32, seed=12)
    k, v = k.to(kv_dtype), v.to(kv_dtype)
    got = attention.causal_attention(q, k, v, 128 ** -0.5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _naive(q, k.float(), v.float(), 128 ** -0.5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [100, 600, 2100])
def test_prefill_chunks_give_the_bits_of_one_pass(backend, length):
    """A prompt prefilled in chunks of rows (or kept from an earlier request and continued)
    attends as one pass over all its rows would, bit for bit, at every cache length."""
    q, k, v = _qkv(12, 2, length, length, 128, torch.float32, seed=13)
    whole = attention.causal_attention(q, k, v, 0.088)
    for start, end in [(0, 37), (37, 37 + 256), (length - 5, length), (length - 1, length)]:
        part = attention.causal_attention(q[:, :, start:end], k[:, :, :end], v[:, :, :end], 0.088)
        assert torch.equal(part[0], whole[0, start:end]), (start, end)


def test_thread_count_does_not_change_a_bit(backend):
    """Threads split a long cache by key chunks; the merge order is fixed, so any thread count
    gives the same bits."""
    q, k, v = _qkv(12, 2, 5, 3000, 128, torch.float32, seed=14)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attention.causal_attention(q, k, v, 0.088)
        torch.set_num_threads(2)
        two = attention.causal_attention(q, k, v, 0.088)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@pytest.mark.parametrize("heads,kv_heads,dim", [(12, 2, 128), (6, 2, 128), (5, 1, 128), (14, 2, 64), (6, 1, 24)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_a_head_gives_its_bits_whichever_heads_and_rows_share_its_keys(backend, heads, kv_heads, dim, kv_dtype):
    """The kernel groups up to six query vectors that read the same keys (heads of one group,
    rows of one pass); a (row, head) computed alone, with one head and one row, has the same
    bits, across whole and partly visible key chunks, for group sizes that do and do not fill a
    group of six (7 heads a KV head: the 0.5B drafter's), and a head_dim that is not a multiple
    of the 16 values a group's value pass takes."""
    q, k, v = _qkv(heads, kv_heads, 5, 700, dim, torch.float32, seed=15)
    k, v = k.to(kv_dtype), v.to(kv_dtype)
    together = attention.causal_attention(q, k, v, 0.088)
    group = heads // kv_heads
    for i in (0, 3, 4):
        visible = 700 - 5 + i + 1
        for h in range(heads):
            g = h // group
            alone = attention.causal_attention(q[:, h : h + 1, i : i + 1], k[:, g : g + 1, :visible],
                                               v[:, g : g + 1, :visible], 0.088)
            assert torch.equal(alone[0, 0, 0], together[0, i, h]), (i, h)


@pytest.mark.skipif("cpu_avx2" not in attention.available_backends(), reason="needs the compiled attention")
def test_allowing_sixteen_lanes_never_forces_them_on_a_cpu_without_avx512():
    """The tile-set switch allows; it must not run AVX-512 code where the CPU has none (a test's
    restore once turned it on, and the draft decoder, which shares the switch, then stopped the
    process with an illegal instruction on an AVX2-only CPU). In a child process, since that
    failure kills the process."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from kernels import attention\n"
        "from kernels.attention import cpu_avx2\n"
        "attention.use_backend('cpu_avx2')\n"
        "cpu_avx2._module().attention_allow_avx512(True)\n"
        "q, k, v = (torch.randn(1, 2, n, 16) for n in (3, 40, 40))\n"
        "attention.causal_attention(q, k, v, 0.25)\n"
        "print(cpu_avx2._module().attention_isa())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ("avx512_vnni" if HAS_VNNI else "avx2")
