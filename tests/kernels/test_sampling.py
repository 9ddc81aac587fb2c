import pytest
import torch

from kernels.sampling import process_logits, sample_from


def test_temperature_one_is_softmax():
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert torch.allclose(process_logits(logits), logits.softmax(-1))


def test_low_temperature_sharpens():
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert process_logits(logits, temperature=0.1)[2] > process_logits(logits)[2]


def test_top_k_keeps_k_largest():
    probs = process_logits(torch.tensor([1.0, 4.0, 3.0, 2.0]), top_k=2)
    assert (probs[[0, 3]] == 0).all() and torch.isclose(probs.sum(), torch.tensor(1.0))
    assert probs[1] > probs[2] > 0


def test_top_p_keeps_smallest_set_reaching_mass():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert (process_logits(logits, top_p=0.7) > 0).tolist() == [True, True, False, False]
    assert (process_logits(logits, top_p=0.5) > 0).tolist() == [True, False, False, False]
    assert (process_logits(logits, top_p=0.1) > 0).sum() == 1  # never empty


def test_batched_rows_are_independent():
    logits = torch.randn(3, 10)
    batched = process_logits(logits, temperature=0.8, top_k=5, top_p=0.9)
    for i in range(3):
        assert torch.allclose(batched[i], process_logits(logits[i], 0.8, 5, 0.9))


def test_zero_temperature_is_refused():
    with pytest.raises(ValueError):
        process_logits(torch.zeros(3), temperature=0)


def _draws(probs: torch.Tensor, draws: int, seed: int = 0, batch: int = 50) -> torch.Tensor:
    """``draws`` tokens from ``probs``, drawn ``batch`` rows at a time (a row is a padded copy)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([sample_from(probs.unsqueeze(0).expand(min(batch, draws - start), -1), gen)
                      for start in range(0, draws, batch)])


def _frequencies(probs: torch.Tensor, draws: int, seed: int = 0) -> torch.Tensor:
    return torch.bincount(_draws(probs, draws, seed, batch=1000), minlength=probs.shape[-1]).double() / draws


def test_draws_follow_the_distribution_across_blocks():
    # Mass spread over several blocks of the two-level draw, with zeros between and a token on
    # the last (padded) block's edge.
    vocab = 5000
    probs = torch.zeros(vocab)
    probs[[0, 1023, 1024, 2500, 4999]] = torch.tensor([0.05, 0.25, 0.1, 0.4, 0.2])
    freq = _frequencies(probs, 40_000)
    sigma = (probs.double() * (1 - probs.double()) / 40_000).sqrt()
    assert ((freq - probs.double()).abs() <= 5 * sigma + 1e-12).all()
    assert freq[probs == 0].sum() == 0


def test_draws_follow_a_dense_distribution():
    # A softmax over 3,000 tokens, as a model's: chi-square over every token against its law
    # (3,000 bins; the statistic's mean is 2,999 and its standard deviation 77).
    probs = (torch.randn(3_000, generator=torch.Generator().manual_seed(5)) * 2).softmax(-1)
    draws = 200_000
    counts = torch.bincount(_draws(probs, draws, seed=2, batch=2_000), minlength=3_000).double()
    expected = probs.double() * draws
    chi_square = ((counts - expected) ** 2 / expected).sum().item()
    assert chi_square < 2_999 + 6 * 77


def test_a_token_of_probability_zero_is_never_drawn():
    for only in (0, 1023, 1024, 151_935):
        probs = torch.zeros(151_936)
        probs[only] = 1.0
        assert (_draws(probs, 100) == only).all()
    # Tiny masses beside a large one: every draw lands on a positive token.
    probs = torch.zeros(151_936)
    probs[[7, 90_000, 151_935]] = torch.tensor([1.0, 1e-30, 1e-38])
    drawn = _draws(probs, 500, seed=1)
    assert (probs[drawn] > 0).all()


def test_draws_keep_the_batch_shape_and_follow_the_seed():
    probs = torch.randn(2, 3, 2_000).softmax(-1)
    first = sample_from(probs, torch.Generator().manual_seed(3))
    assert first.shape == (2, 3) and first.dtype == torch.long
    assert torch.equal(first, sample_from(probs, torch.Generator().manual_seed(3)))
