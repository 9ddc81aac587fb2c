"""Route a bf16 model's linear layers through kernels.linear's fast CPU backend.

Only where it pays and is supported: bf16 weights on the CPU with a compiled backend. The
module objects stay the same (weights are shared, nothing is copied), only their forward changes.
"""
from __future__ import annotations

import logging
import types

import torch

from kernels import linear as linear_kernels

log = logging.getLogger(__name__)


def _fast_forward(self, x: torch.Tensor) -> torch.Tensor:
    return linear_kernels.linear(x, self.weight, self.bias)


def _fast_forward_multi_row(self, x: torch.Tensor) -> torch.Tensor:
    # One row: PyTorch's own bf16 GEMV is as fast or faster, and a drafter needs no batch
    # invariance (the target's verification keeps the output exact whatever it proposes).
    if x.numel() == x.shape[-1]:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    return linear_kernels.linear(x, self.weight, self.bias)


def accelerate_linears(model: torch.nn.Module, batch_invariant: bool = True) -> int:
    """Patch every bf16 CPU nn.Linear of ``model``; returns how many were patched (0 when the
    fast backend is unavailable, e.g. no compiler or no AVX2). ``batch_invariant`` routes every
    call through the kernel, so k+1 verified rows equal k+1 single-row steps bit for bit (the
    target); otherwise single rows use PyTorch's GEMV (drafters)."""
    params = next(model.parameters())
    if params.device.type != "cpu" or params.dtype != torch.bfloat16:
        return 0
    if linear_kernels.fast_backend() is None:
        return 0
    count = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.dtype == torch.bfloat16:
            if not module.weight.is_contiguous():
                module.weight.data = module.weight.data.contiguous()
            forward = _fast_forward if batch_invariant else _fast_forward_multi_row
            module.forward = types.MethodType(forward, module)
            count += 1
    log.info("fast CPU linear kernel on %d layers", count)
    return count


def backend_name() -> str:
    """The bf16 linear kernel in use: 'cpu_avx2' (compiled) or 'reference' (stock PyTorch), for
    reports such as the app's self-test. Loads (and on first use compiles) the fast backend."""
    backend = linear_kernels.fast_backend()
    return "reference" if backend is None else backend.__name__.rsplit(".", 1)[-1]
