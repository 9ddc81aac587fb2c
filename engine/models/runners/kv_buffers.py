"""The key/value cache of a runner that computes its decoder layers itself (FusedRunner: fp32,
GgufRunner: fp16): one [layers, kv_heads, capacity, head_dim] tensor each for keys and values,
grown by doubling (a rollback only moves the runner's length; the rows stay until overwritten)."""
from __future__ import annotations

import torch


class KVBuffers:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int = 256,
                 dtype: torch.dtype = torch.float32) -> None:
        self.k = torch.zeros(layers, kv_heads, capacity, head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def ensure(self, positions: int) -> None:
        """Room for ``positions`` cached positions (at least double the old room when growing)."""
        if positions <= self.capacity:
            return
        shape = (*self.k.shape[:2], max(positions, 2 * self.capacity), self.k.shape[3])
        k, v = torch.zeros(shape, dtype=self.k.dtype), torch.zeros(shape, dtype=self.k.dtype)
        k[:, :, : self.capacity] = self.k
        v[:, :, : self.capacity] = self.v
        self.k, self.v = k, v
