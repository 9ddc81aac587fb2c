"""The batch-invariant attention a CPU target decodes with keeps the causal mask right where it
hands over to PyTorch's SDPA: a prompt chunk of more than PREFILL_ROWS rows after cached ones (a
chat's next turn) sees every earlier key, as one long prefill would."""
from __future__ import annotations

import pytest
import torch

from engine.models.runners.invariant_attention import PREFILL_ROWS, use_batch_invariant_attention
from engine.models.runners.runner import ModelRunner
from engine.testing.tiny_models import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    model = build_model(512, layers=2, seed=1)
    if not use_batch_invariant_attention(model):
        pytest.skip("no compiled attention kernel here")
    return model


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("second", [PREFILL_ROWS + 3, 5, 1], ids=["long-chunk", "verify-block", "one-token"])
def test_a_chunk_after_cached_tokens_attends_to_them_all(model, second):
    first, then = _ids(PREFILL_ROWS + 6, 0), _ids(second, 1)
    chunked = ModelRunner(model)
    chunked.forward(first, 1)
    ours = chunked.forward(then, min(4, second))
    whole = ModelRunner(model).forward(first + then, min(4, second))
    assert torch.allclose(ours, whole, atol=1e-4 * whole.abs().max().item()), (ours - whole).abs().max()
