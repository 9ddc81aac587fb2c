"""add_rms_norm: the residual add and transformers' RMSNorm after it, with the bits of
transformers' own module on every backend (the GGUF runner's equality with transformers rests
on it)."""
import pytest
import torch
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from kernels import norm
from kernels.norm import reference


@pytest.fixture(params=norm.available_backends())
def backend(request):
    chosen = norm.active_backend()
    norm.use_backend(request.param)
    yield request.param
    norm.use_backend(chosen)


def _rows(n, width, seed):
    gen = torch.Generator().manual_seed(seed)
    # Residual streams of trained models carry a few large values beside small ones.
    x = torch.randn(n, width, generator=gen) * torch.rand(n, width, generator=gen).pow(4) * 60
    return x, torch.randn(n, width, generator=gen), torch.randn(width, generator=gen)


@pytest.mark.parametrize("rows", [1, 5, 70])
@pytest.mark.parametrize("width,eps", [(1536, 1e-6), (896, 1e-6), (4096, 1e-5), (20, 1e-6)])
def test_the_residual_and_its_norm_are_transformers_bit_for_bit(backend, rows, width, eps):
    x, delta, weight = _rows(rows, width, seed=rows * width)
    module = Qwen2RMSNorm(width, eps=eps)
    with torch.no_grad():
        module.weight.copy_(weight)
        expected = module(x + delta)
    s, normed = norm.add_rms_norm(x, delta, weight, eps)
    assert torch.equal(s, x + delta)
    assert torch.equal(normed, expected)


def test_the_reference_norm_is_transformers_module():
    x, _, weight = _rows(3, 64, seed=1)
    module = Qwen2RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(weight)
        assert torch.equal(reference.rms_norm(x, weight, 1e-6), module(x))


def test_bad_inputs_are_refused():
    if "cpu_avx2" not in norm.available_backends():
        pytest.skip("no compiled norm kernel here")
    from kernels.norm import cpu_avx2

    x, delta, weight = _rows(4, 32, seed=2)
    with pytest.raises(RuntimeError, match="contiguous"):
        cpu_avx2.add_rms_norm(x.t().contiguous().t(), delta, weight, 1e-6)
    with pytest.raises(RuntimeError, match="fp32"):
        cpu_avx2.add_rms_norm(x.double(), delta.double(), weight.double(), 1e-6)
    with pytest.raises(RuntimeError, match="expects x and delta"):
        cpu_avx2.add_rms_norm(x, delta, weight[:-1], 1e-6)
