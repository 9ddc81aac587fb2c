"""What one target step and one draft step cost here, measured side by side.

c = (drafter step) / (one-token target step) is what limits speculation: a pass that drafts k
tokens costs k*c target steps of drafting on top of verification. Measured interleaved (target,
drafter, target, ...) on the same context so that both see the same machine load.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from engine.core.sampler import Sampler
from engine.core.settings import DecodeSettings
from engine.drafters import DraftModelDrafter
from engine.models.runners.runner import ModelRunner


@dataclass(frozen=True)
class StepCosts:
    target_ms: float
    draft_ms: float

    @property
    def c(self) -> float:
        return self.draft_ms / self.target_ms if self.target_ms else 0.0


def measure_step_costs(target: ModelRunner, drafter: DraftModelDrafter, context: list[int], repeats: int = 7) -> StepCosts:
    """Median ms of a one-token target pass and of one draft step, after ``context``."""
    sampler = Sampler(DecodeSettings())
    target.reset()
    target.forward(context[:-1])
    drafter.prepare(context)
    t_ms, d_ms = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        target.forward(context[-1:])
        t_ms.append((time.perf_counter() - start) * 1000)
        target.crop(len(context) - 1)
        start = time.perf_counter()
        drafter.propose(context, 1, sampler)
        d_ms.append((time.perf_counter() - start) * 1000)
        drafter.observe(len(context) - 1)
    target.reset()
    drafter.reset()
    return StepCosts(statistics.median(t_ms), statistics.median(d_ms))
