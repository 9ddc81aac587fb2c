"""The panel layout drafters keep their int8 weights in."""
import pytest
import torch

from kernels.linear.packing import can_pack, out_features, pack, unpack


def test_packing_round_trips_and_refuses_odd_row_counts():
    w = torch.randint(-127, 128, (24, 10), dtype=torch.int8)
    packed = pack(w)
    assert packed.shape == (3, 10, 8) and packed[1, 4, 5] == w[13, 4] and out_features(packed) == 24
    assert torch.equal(unpack(packed), w)
    assert not can_pack(torch.zeros(20, 10))
    with pytest.raises(ValueError, match="multiple of 8"):
        pack(torch.zeros(20, 10))
