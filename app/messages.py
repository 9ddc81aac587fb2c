"""What the engine worker tells the window, besides the engine's own events. Frozen and typed:
they cross from the worker thread to the GUI thread."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobEvent:
    """Envelope for everything a job emits; ``job`` lets the window ignore stale jobs."""

    job: int
    kind: str
    payload: object


@dataclass(frozen=True)
class Progress:
    """A long step: ``done``/``total`` in ``unit`` (bytes, steps...); ``total`` 0 = unknown."""

    stage: str
    done: int
    total: int
    unit: str = ""
    detail: str = ""


@dataclass(frozen=True)
class ModelLoaded:
    target: str
    drafter: str | None
    precision: str
    device: str
    seconds: float
    target_path: str = ""
    drafter_path: str = ""


@dataclass(frozen=True)
class MachineReport:
    """Hardware summary and, per catalog entry, its memory fit (engine.memory_fit.FitResult)."""

    hardware: object
    fits: tuple = ()
    installed: frozenset[str] = field(default_factory=frozenset)
    default_pair_ready: bool = False
    error: str = ""


@dataclass(frozen=True)
class JobFailed:
    message: str


@dataclass(frozen=True)
class JobEnded:
    cancelled: bool
