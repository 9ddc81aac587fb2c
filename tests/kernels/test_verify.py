import pytest
import torch

from kernels.verify import (
    active_backend,
    available_backends,
    use_backend,
    verify_greedy,
    verify_sampled,
)


@pytest.fixture(params=available_backends(), autouse=True)
def backend(request):
    before = active_backend()
    use_backend(request.param)
    yield request.param
    use_backend(before)  # what the import chose, for the tests that follow


def one_hot_logits(tokens, vocab=6):
    logits = torch.full((len(tokens), vocab), -5.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


def test_greedy_all_accepted_gives_bonus_token():
    verdict = verify_greedy(torch.tensor([1, 2, 3]), one_hot_logits([1, 2, 3, 4]))
    assert verdict == (3, 4)


def test_greedy_first_rejected_gives_target_token():
    verdict = verify_greedy(torch.tensor([0, 2, 3]), one_hot_logits([1, 2, 3, 4]))
    assert verdict == (0, 1)


def test_greedy_rejection_in_the_middle_ignores_later_agreement():
    verdict = verify_greedy(torch.tensor([1, 5, 3]), one_hot_logits([1, 2, 3, 4]))
    assert verdict == (1, 2)


def test_greedy_k0_is_plain_decoding():
    verdict = verify_greedy(torch.tensor([], dtype=torch.long), one_hot_logits([4]))
    assert verdict == (0, 4)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown verify backend"):
        use_backend("nope")


def random_dists(rows, vocab, gen, sharpness=1.0):
    return (torch.randn(rows, vocab, generator=gen) * sharpness).softmax(-1)


def test_sampled_p_equals_q_accepts_everything():
    gen = torch.Generator().manual_seed(0)
    p = random_dists(4, 8, gen)
    for _ in range(200):
        drafts = torch.multinomial(p[:3], 1, generator=gen).squeeze(-1)
        assert verify_sampled(drafts, p[:3], p, gen).n_accepted == 3


def test_sampled_degenerate_target_rejects_impossible_draft():
    gen = torch.Generator().manual_seed(0)
    p = torch.zeros(2, 5)
    p[:, 3] = 1.0  # the target can only say 3
    q = torch.full((1, 5), 0.2)
    for draft in (0, 1, 2, 4):
        assert verify_sampled(torch.tensor([draft]), q, p, gen) == (0, 3)
    assert verify_sampled(torch.tensor([3]), q, p, gen) == (1, 3)


def test_sampled_deterministic_draft_never_resamples_rejected_token():
    gen = torch.Generator().manual_seed(2)
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    for _ in range(300):
        verdict = verify_sampled(torch.tensor([0]), None, p, gen)
        if verdict.n_accepted == 0:
            assert verdict.next_token == 1


def test_same_generator_state_gives_same_verdict():
    p = random_dists(5, 10, torch.Generator().manual_seed(3))
    q = random_dists(4, 10, torch.Generator().manual_seed(4))
    drafts = torch.tensor([1, 2, 3, 4])
    a = [verify_sampled(drafts, q, p, torch.Generator().manual_seed(9)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
