"""The sampled verification rule keeps the target's distribution, whatever the drafter does.

The statistical trials (thousands of verdicts each) run on the reference, which is the spec; each
other backend must then give the reference's verdict, draw for draw, from the same generator state
(a few hundred verdicts): together that holds every backend to the same distribution without
running the Triton interpreter through 36,000 trials.
"""
import pytest
import torch

from kernels.verify import (
    active_backend,
    available_backends,
    use_backend,
    verify_sampled,
)
from tests.stats_helpers import assert_same_distribution


@pytest.fixture
def on_backend():
    before = active_backend()
    yield use_backend
    use_backend(before)  # what the import chose, for the tests that follow


@pytest.fixture(autouse=True)
def reference(on_backend):
    on_backend("reference")


def random_dists(rows, vocab, gen, sharpness=1.0):
    return (torch.randn(rows, vocab, generator=gen) * sharpness).softmax(-1)


def drafter_dists(drafter, p, k, gen):
    if drafter == "far":  # mass where the target has little
        q = (1.0 - p[:k]) ** 4
        return q / q.sum(-1, keepdim=True)
    if drafter == "deterministic":
        return None
    return (p[:k].log() + 0.3 * torch.randn(k, p.shape[-1], generator=gen)).softmax(-1)


def verdicts(drafter, trials, seed=5, vocab=6, k=3):
    """(drafts, verdict) for ``trials`` rounds of drafting from q and verifying against p."""
    gen = torch.Generator().manual_seed(seed)
    p = random_dists(k + 1, vocab, gen, sharpness=1.5)
    q = drafter_dists(drafter, p, k, gen)
    for _ in range(trials):
        if k == 0:
            drafts = torch.tensor([], dtype=torch.long)
            yield p, drafts, verify_sampled(drafts, torch.zeros(0, vocab), p, gen)
        elif q is None:
            drafts = torch.arange(k)
            yield p, drafts, verify_sampled(drafts, None, p, gen)
        else:
            drafts = torch.multinomial(q, 1, generator=gen).squeeze(-1)
            yield p, drafts, verify_sampled(drafts, q, p, gen)


def test_sampled_k0_samples_from_target():
    draws, p = [], None
    for p, _, verdict in verdicts("close", 6000, seed=1, k=0):
        draws.append(verdict.next_token)
    assert_same_distribution(torch.tensor(draws), p[0])


@pytest.mark.parametrize("drafter", ["far", "close", "deterministic"])
def test_sampled_verification_is_lossless(drafter):
    """Tokens emitted at positions 1 and 2 follow p_1 and p_2 whatever the drafter does."""
    first, second, p = [], [], None
    for p, drafts, verdict in verdicts(drafter, 12000):
        emitted = [*drafts[: verdict.n_accepted].tolist(), verdict.next_token]
        first.append(emitted[0])
        if len(emitted) > 1:  # p_2 only applies when position 2 was produced in this pass
            second.append(emitted[1])
    assert_same_distribution(torch.tensor(first), p[0])
    if len(second) > 2000:
        assert_same_distribution(torch.tensor(second), p[1])


@pytest.mark.parametrize("backend", [b for b in available_backends() if b != "reference"])
@pytest.mark.parametrize("drafter,k", [("far", 3), ("close", 3), ("deterministic", 3), ("close", 0)])
def test_every_backend_gives_the_reference_verdicts_draw_for_draw(on_backend, backend, drafter, k):
    expected = [tuple(v) for _, _, v in verdicts(drafter, 200, seed=11, k=k)]
    on_backend(backend)
    got = [tuple(v) for _, _, v in verdicts(drafter, 200, seed=11, k=k)]
    assert got == expected
