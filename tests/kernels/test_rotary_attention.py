"""rotary_attention: a decoder layer's attention from its q / k / v projection in one call gives
the bits of the sequence it replaces (PyTorch's rotation ops, the copy into the cache, then
causal_attention), on each backend and tile set, for every cache dtype."""
import pytest
import torch

from kernels import attention
from kernels.attention import reference
from tests.kernels.isa import kernel_in_use, kernel_params


@pytest.fixture(params=kernel_params(attention.available_backends()))
def backend(request):
    with kernel_in_use(attention, request.param, "attention_isa", "attention_allow_avx512") as param:
        yield param.partition("/")[0]


def _inputs(heads, kv_heads, rows, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen) * 3
    angles = torch.rand(rows, dim // 2, generator=gen) * 50
    angles = torch.cat((angles, angles), dim=-1)
    sin = angles.sin()
    return qkv, angles.cos(), torch.cat((-sin[:, : dim // 2], sin[:, dim // 2 :]), dim=-1)


def _caches(layers, kv_heads, capacity, dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(layers, kv_heads, capacity, dim, generator=gen).to(dtype)
    return k, torch.randn(k.shape, generator=gen).to(dtype)


def _step_by_step(qkv, cos, ssin, k_cache, v_cache, layer, start, heads, kv_heads, scaling):
    """What the GGUF runner computed op by op before: rotate q and k together, copy k and v
    into the cache (rounded to its dtype), attend with the active backend's causal_attention."""
    n, dim = qkv.shape[0], k_cache.shape[-1]
    qk = reference.rotate(qkv[:, : (heads + kv_heads) * dim].view(n, heads + kv_heads, dim), cos[:, None], ssin[:, None])
    k_cache[layer, :, start : start + n] = qk[:, heads:].transpose(0, 1)
    v_cache[layer, :, start : start + n] = qkv[:, (heads + kv_heads) * dim :].view(n, kv_heads, dim).transpose(0, 1)
    query = qk[:, :heads].transpose(0, 1).unsqueeze(0)
    keys, values = k_cache[layer : layer + 1, :, : start + n], v_cache[layer : layer + 1, :, : start + n]
    return attention.causal_attention(query, keys, values, scaling)[0].reshape(n, heads * dim)


@pytest.mark.parametrize("heads,kv_heads,dim", [(12, 2, 128), (4, 4, 64), (6, 3, 24)])
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,start", [(1, 0), (1, 300), (5, 41), (70, 9)])
def test_one_call_gives_the_bits_of_the_step_by_step_sequence(backend, heads, kv_heads, dim, kv_dtype, rows, start):
    qkv, cos, ssin = _inputs(heads, kv_heads, rows, dim, seed=rows + start)
    k_ours, v_ours = _caches(3, kv_heads, 400, dim, kv_dtype, seed=dim)
    k_theirs, v_theirs = k_ours.clone(), v_ours.clone()
    ours = attention.rotary_attention(qkv, cos, ssin, k_ours, v_ours, 1, start, heads, kv_heads, dim ** -0.5)
    theirs = _step_by_step(qkv, cos, ssin, k_theirs, v_theirs, 1, start, heads, kv_heads, dim ** -0.5)
    assert ours.shape == (rows, heads * dim)
    # The new rows only changed, rounded alike. A rotation fusing a product into its sum (one
    # rounding, FMA) would differ from PyTorch's ops in the last bit of many of these keys.
    assert torch.equal(k_ours, k_theirs) and torch.equal(v_ours, v_theirs)
    assert torch.equal(ours, theirs)


def test_bad_shapes_are_refused():
    if "cpu_avx2" not in attention.available_backends():
        pytest.skip("no compiled attention kernel here")
    from kernels.attention import cpu_avx2

    qkv, cos, ssin = _inputs(4, 2, 3, 16, seed=0)
    k_cache, v_cache = _caches(2, 2, 8, 16, torch.float16, seed=1)
    with pytest.raises(RuntimeError, match="cache rows out of range"):
        cpu_avx2.rotary_attention(qkv, cos, ssin, k_cache, v_cache, 0, 6, 4, 2, 0.25)  # rows 6 .. 8 of 8
    with pytest.raises(RuntimeError, match="qkv must be"):
        cpu_avx2.rotary_attention(qkv[:, :-16], cos, ssin, k_cache, v_cache, 0, 0, 4, 2, 0.25)
    with pytest.raises(RuntimeError, match="one contiguous layout"):
        cpu_avx2.rotary_attention(qkv, cos, ssin, k_cache, v_cache[:, :, :4], 0, 0, 4, 2, 0.25)
