"""The fused int8 decoder layer: every backend against the reference (the spec)."""
import pytest
import torch

from kernels import draft_decoder, quant_linear
from kernels.draft_decoder import reference
from tests.kernels.isa import kernel_in_use, kernel_params


@pytest.fixture(params=draft_decoder.available_backends())
def backend(request):
    previous = draft_decoder.backends.active_name()
    draft_decoder.use_backend(request.param)
    yield request.param
    draft_decoder.use_backend(previous)  # later tests (fused int8 / int4 targets) keep the fast kernel


def layer_weights(h, n_heads, n_kv, d, inter, biases, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def lin(n, k, bias):
        q, s = quant_linear.quantize(torch.randn(n, k, generator=gen) / k**0.5)
        return (q, s, torch.randn(n, generator=gen) * 0.1 if bias else None)

    ln = lambda: 1 + 0.1 * torch.randn(h, generator=gen)  # noqa: E731
    return (ln(), *lin(n_heads * d, h, biases), *lin(n_kv * d, h, biases), *lin(n_kv * d, h, biases),
            *lin(h, n_heads * d, False), ln(), *lin(inter, h, False)[:2], *lin(inter, h, False)[:2],
            *lin(h, inter, False)[:2])


def rope_tables(pos0, m, d):
    angles = torch.arange(pos0, pos0 + m, dtype=torch.float32)[:, None] * (10000.0 ** (-torch.arange(0, d, 2) / d))[None]
    return angles.cos().contiguous(), angles.sin().contiguous()


def packed(weights):
    """The drafter's layout: every int8 weight in panels of 8 rows (engine.quant.quantize.Int8Linear.pack)."""
    from kernels.linear.packing import can_pack, pack

    return tuple(pack(w) if w is not None and w.dtype == torch.int8 and can_pack(w) else w for w in weights)


@pytest.mark.parametrize("n_heads,n_kv", [(4, 2), (14, 2), (4, 4)])
@pytest.mark.parametrize("steps", [[1, 1, 1], [5, 1, 2], [9], [3, 7, 1]])
@pytest.mark.parametrize("biases", [True, False])
@pytest.mark.parametrize("layout", ["rows", "packed", "int16 inputs"])
def test_backend_matches_reference_over_several_calls(backend, n_heads, n_kv, steps, biases, layout):
    """"int16 inputs": an int8 target's layers (row layout, inputs rounded to int16)."""
    h, d, inter, cap = 64, 16, 96, 32
    weights = layer_weights(h, n_heads, n_kv, d, inter, biases)
    reference_weights = weights
    if layout == "packed":
        weights = packed(weights)
        assert sum(w is not None and w.dim() == 3 for w in weights) == 7
    extra = ([], True) if layout == "int16 inputs" else ()
    caches = {name: (torch.zeros(n_kv, cap, d), torch.zeros(n_kv, cap, d)) for name in ("got", "want")}
    pos = 0
    for i, m in enumerate(steps):
        x = torch.randn(m, h, generator=torch.Generator().manual_seed(i))
        cos, sin = rope_tables(pos, m, d)
        got, want = x.clone(), x.clone()
        draft_decoder.decoder_layer(got, *weights, *caches["got"], cos, sin, pos, n_heads, n_kv, 1e-6, *extra)
        reference.decoder_layer(want, *reference_weights, *caches["want"], cos, sin, pos, n_heads, n_kv, 1e-6, *extra)
        # With int16 inputs a last-bit difference upstream (attention, summation order) can move
        # an input across a rounding boundary: one step is 1/32767 of its block's largest.
        tol = 1e-3 if extra else 1e-4
        assert torch.allclose(got, want, rtol=tol, atol=tol), (got - want).abs().max()
        pos += m
    for a, b in zip(caches["got"], caches["want"]):
        assert torch.allclose(a[:, :pos], b[:, :pos], rtol=tol, atol=tol)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_long_caches_cross_the_attention_chunks(backend, kv_dtype):
    """A drafter's cache at a conversation's length: rows that see several 256-key chunks of
    the attention kernel, one row and a few (a draft step, a catch-up) after a long prefill."""
    h, n_heads, n_kv, d, inter, cap = 128, 14, 2, 64, 192, 640
    weights = packed(layer_weights(h, n_heads, n_kv, d, inter, True, seed=3))
    reference_weights = layer_weights(h, n_heads, n_kv, d, inter, True, seed=3)
    caches = {name: (torch.zeros(n_kv, cap, d, dtype=kv_dtype), torch.zeros(n_kv, cap, d, dtype=kv_dtype)) for name in ("got", "want")}
    pos = 0
    for i, m in enumerate([300, 1, 5, 250, 1]):
        x = torch.randn(m, h, generator=torch.Generator().manual_seed(10 + i))
        cos, sin = rope_tables(pos, m, d)
        got, want = x.clone(), x.clone()
        draft_decoder.decoder_layer(got, *weights, *caches["got"], cos, sin, pos, n_heads, n_kv, 1e-6)
        reference.decoder_layer(want, *reference_weights, *caches["want"], cos, sin, pos, n_heads, n_kv, 1e-6)
        # fp16: a last-bit difference upstream can round a cached value to the next fp16 step.
        tol = 1e-4 if kv_dtype == torch.float32 else 2e-3
        assert torch.allclose(got, want, rtol=tol, atol=tol), (m, (got - want).abs().max())
        pos += m
    assert caches["got"][0].dtype == kv_dtype
    for a, b in zip(caches["got"], caches["want"]):
        assert torch.allclose(a[:, :pos].float(), b[:, :pos].float(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("int16_inputs", [False, True])
def test_attention_is_causal_within_a_block(backend, int16_inputs):
    """Row m of a block must not see rows after it: feeding one by one equals feeding at once."""
    h, n_heads, n_kv, d, inter = 64, 4, 2, 16, 96
    weights = layer_weights(h, n_heads, n_kv, d, inter, True, seed=1)
    extra = ([], int16_inputs)
    x = torch.randn(6, h, generator=torch.Generator().manual_seed(2))
    together = x.clone()
    cos, sin = rope_tables(0, 6, d)
    draft_decoder.decoder_layer(together, *weights, torch.zeros(n_kv, 8, d), torch.zeros(n_kv, 8, d), cos, sin, 0, n_heads, n_kv, 1e-6,
                                *extra)
    kc, vc = torch.zeros(n_kv, 8, d), torch.zeros(n_kv, 8, d)
    for i in range(6):
        row = x[i : i + 1].clone()
        cos, sin = rope_tables(i, 1, d)
        draft_decoder.decoder_layer(row, *weights, kc, vc, cos, sin, i, n_heads, n_kv, 1e-6, *extra)
        assert torch.allclose(row, together[i : i + 1], rtol=1e-4, atol=1e-4)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown draft_decoder backend"):
        draft_decoder.use_backend("nope")


def int4_layer(h, n_heads, n_kv, d, inter, biases, seed=0):
    """The same layer with int4 weights: (weights..., offsets) as an int4 drafter holds them."""
    from kernels import int4_linear

    gen = torch.Generator().manual_seed(seed)
    offsets = []

    def lin(n, k, bias):
        packed_w, scale, offset = int4_linear.quantize(torch.randn(n, k, generator=gen) / k**0.5)
        offsets.append(offset)
        return (packed_w, scale, torch.randn(n, generator=gen) * 0.1 if bias else None)

    ln = lambda: 1 + 0.1 * torch.randn(h, generator=gen)  # noqa: E731
    weights = (ln(), *lin(n_heads * d, h, biases), *lin(n_kv * d, h, biases), *lin(n_kv * d, h, biases),
               *lin(h, n_heads * d, False), ln(), *lin(inter, h, False)[:2], *lin(inter, h, False)[:2],
               *lin(h, inter, False)[:2])
    return weights, offsets


@pytest.mark.parametrize("n_heads,n_kv", [(4, 2), (14, 2)])
@pytest.mark.parametrize("steps", [[1, 1, 1], [5, 1, 2], [9]])
@pytest.mark.parametrize("biases", [True, False])
def test_int4_layer_matches_reference(backend, n_heads, n_kv, steps, biases):
    h, d, inter, cap = 64, 16, 96, 32
    weights, offsets = int4_layer(h, n_heads, n_kv, d, inter, biases)
    caches = {name: (torch.zeros(n_kv, cap, d), torch.zeros(n_kv, cap, d)) for name in ("got", "want")}
    pos = 0
    for i, m in enumerate(steps):
        x = torch.randn(m, h, generator=torch.Generator().manual_seed(i))
        cos, sin = rope_tables(pos, m, d)
        got, want = x.clone(), x.clone()
        draft_decoder.decoder_layer(got, *weights, *caches["got"], cos, sin, pos, n_heads, n_kv, 1e-6, offsets)
        reference.decoder_layer(want, *weights, *caches["want"], cos, sin, pos, n_heads, n_kv, 1e-6, offsets)
        # Each int4 layer rounds its inputs to int8: a last-bit difference upstream (attention's
        # summation order) can move one input across a rounding boundary, a step of ~1/127 of
        # its group's largest value; through the down projection that moved outputs (~1-4 in
        # size) by up to 0.031 here. A wrong scale, offset or lane order moves them by ~0.1-1.
        assert torch.allclose(got, want, rtol=1e-2, atol=5e-2), (got - want).abs().max()
        pos += m


@pytest.fixture(params=kernel_params(draft_decoder.available_backends()))
def int4_tiles(request):
    """Every backend, and the compiled one with each int4 tile set the CPU has."""
    with kernel_in_use(draft_decoder, request.param, "int4_isa", "int4_allow_vnni") as param:
        yield param


@pytest.mark.parametrize("steps", [[1, 1], [5]])
def test_int4_projections_sharing_one_region_keep_their_own_panels(int4_tiles, steps):
    """q / k / v (and gate / up) run as one group over all their panels; with 10-panel k and v
    the group's blocks of 4 panels straddle two weights, and each weight's outputs must still be
    its own."""
    n_heads, n_kv, h, d, inter, cap = 20, 5, 64, 8, 96, 16
    weights, offsets = int4_layer(h, n_heads, n_kv, d, inter, biases=True, seed=3)
    caches = {name: (torch.zeros(n_kv, cap, d), torch.zeros(n_kv, cap, d)) for name in ("got", "want")}
    pos = 0
    for i, m in enumerate(steps):
        x = torch.randn(m, h, generator=torch.Generator().manual_seed(10 + i))
        cos, sin = rope_tables(pos, m, d)
        got, want = x.clone(), x.clone()
        draft_decoder.decoder_layer(got, *weights, *caches["got"], cos, sin, pos, n_heads, n_kv, 1e-6, offsets)
        reference.decoder_layer(want, *weights, *caches["want"], cos, sin, pos, n_heads, n_kv, 1e-6, offsets)
        assert torch.allclose(got, want, rtol=1e-2, atol=5e-2), (got - want).abs().max()
        assert torch.allclose(caches["got"][0], caches["want"][0], rtol=1e-3, atol=1e-3)  # k landed in k's cache
        assert torch.allclose(caches["got"][1], caches["want"][1], rtol=1e-3, atol=1e-3)
        pos += m


def test_an_int4_layer_without_offsets_is_refused():
    if "cpu_avx2" not in draft_decoder.available_backends():
        pytest.skip("no compiled kernel here")
    from kernels.draft_decoder import cpu_avx2

    weights, _ = int4_layer(64, 4, 2, 16, 96, False)
    cos, sin = rope_tables(0, 1, 16)
    with pytest.raises(RuntimeError, match="offsets"):
        cpu_avx2.decoder_layer(torch.randn(1, 64), *weights, torch.zeros(2, 8, 16), torch.zeros(2, 8, 16), cos, sin, 0, 4, 2, 1e-6)
