import pytest
import torch

from kernels.sampling import process_logits


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
