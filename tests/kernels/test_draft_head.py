"""The reduced drafter head: backends against the reference, and what a subset means."""
import pytest
import torch

from kernels import draft_head, quant_linear
from kernels.draft_head import reference


@pytest.fixture(params=draft_head.available_backends())
def backend(request):
    before = draft_head.active_backend()
    draft_head.use_backend(request.param)
    yield request.param
    draft_head.use_backend(before)  # what the import chose, for the tests that follow


def rows(kind, s=37, h=64, seed=0):
    w = torch.randn(s, h, generator=torch.Generator().manual_seed(seed))
    if kind == "int8":
        return quant_linear.quantize(w)
    return w.to(torch.bfloat16 if kind == "bf16" else torch.float32), None


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("hidden_dtype", [torch.float32, torch.bfloat16])
def test_subset_logits_match_reference(backend, kind, n, hidden_dtype):
    weight, scale = rows(kind)
    hidden = torch.randn(n, 64, generator=torch.Generator().manual_seed(n)).to(hidden_dtype)
    got = draft_head.subset_logits(hidden, weight, scale)
    want = reference.subset_logits(hidden, weight, scale)
    assert got.dtype == torch.float32 and got.shape == (n, 37)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_reduced_logits_are_the_full_logits_at_the_kept_rows(backend):
    full = torch.randn(500, 32)
    ids = torch.tensor([3, 17, 42, 99, 250, 499])
    hidden = torch.randn(2, 32)
    sub = draft_head.subset_logits(hidden, full.index_select(0, ids))
    assert torch.allclose(sub, (hidden @ full.t())[:, ids], rtol=1e-5, atol=1e-5)


def test_greedy_proposes_only_subset_tokens(backend):
    vocab, ids = 1000, torch.tensor([5, 7, 11, 13])
    full_logits = torch.randn(50, vocab)
    full_logits[:, 0] = 100.0  # the full head's favourite is outside the subset
    chosen = draft_head.greedy_ids(full_logits[:, ids], ids)
    assert set(chosen.tolist()) <= set(ids.tolist())
    assert torch.equal(chosen, ids[full_logits[:, ids].argmax(-1)])


def test_to_vocab_scatters_a_distribution_with_zeros_elsewhere(backend):
    ids = torch.tensor([9, 2, 4])
    q_sub = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    q = draft_head.to_vocab(q_sub, ids, 10)
    assert q.shape == (2, 10)
    assert torch.allclose(q.sum(-1), torch.ones(2))
    assert torch.equal(q[:, ids], q_sub)
    outside = torch.ones(10, dtype=torch.bool)
    outside[ids] = False
    assert (q[:, outside] == 0).all()


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown draft_head backend"):
        draft_head.use_backend("nope")
