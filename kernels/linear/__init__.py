"""bf16-weight linear layers whose cost barely grows with the number of rows.

Why: on CPUs without native bf16 matmul (AVX2, no AVX-512 BF16) PyTorch's bf16 linear costs
about 0.6 of a one-token step for every extra row, so verifying k drafted tokens costs ~k steps
and speculation cannot pay. The AVX2 backend streams each weight row from memory once, widens it
to fp32 in registers and applies it to all M rows: for the small M of decoding and verification
the cost stays that of reading the weights once.

Each output row is computed with the same instruction sequence whatever M is, so results are
batch-invariant: verifying k+1 tokens gives bit-identical logits to decoding them one by one,
which keeps greedy speculation token-identical to plain decoding in bf16 too.
"""
from __future__ import annotations

from kernels.backends import CpuBackends, package_api
from kernels.linear import reference

backends = CpuBackends("linear", reference, "CPU linear")
available_backends, active_backend, fast_backend, use_backend = package_api(__name__)


def linear(x, weight, bias=None):
    return backends.active.linear(x, weight, bias)


__all__ = ["active_backend", "available_backends", "fast_backend", "linear", "use_backend"]
