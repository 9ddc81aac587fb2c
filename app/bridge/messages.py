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
    #: The drafter the engine offers for this target: "model" (a draft model or a Gemma 4
    #: assistant), "mtp" (the target's own MTP layers) or "lookup" (nothing to load).
    drafter_kind: str = "model"
    #: Says which drafter is used and why, when it is not the obvious one.
    note: str | None = None
    #: Why a drafter given with the target was refused (another vocabulary, a mismatched
    #: assistant); the target then loaded alone.
    drafter_refused: str | None = None
    #: The per-model settings the load applied (app.picker.model_settings.ModelSettings) and the
    #: threads the engine thread then ran with; None when loaded without them.
    settings: object = None
    threads: int = 0
    #: With "Keep in RAM": what was locked, or why it could not be (None when not asked).
    resident: str | None = None
    #: The separate draft model that drafts (alone, or beside a drafter made for the target),
    #: and, where it is beside one, its name: the demo can race the two ("race").
    draft_model_path: str = ""
    race_against: str | None = None


@dataclass(frozen=True)
class DrafterNote:
    """The engine replaced the drafter the user chose (engine.session.session.Session.drafter_note)."""

    text: str


@dataclass(frozen=True)
class MachineReport:
    """Hardware summary and, per catalog entry, its memory fit (engine.models.planning.fit.FitResult)."""

    hardware: object
    fits: tuple = ()
    installed: frozenset[str] = field(default_factory=frozenset)
    default_pair_ready: bool = False
    error: str = ""
    #: Why the Hub cannot be reached ("" when it can, or was not asked): HF_HUB_OFFLINE, or a
    #: quick connection probe that failed.
    offline: str = ""


@dataclass(frozen=True)
class KernelReport:
    """kernels.cpu_kernel_report(), fetched on the worker (it imports torch)."""

    text: str


@dataclass(frozen=True)
class JobFailed:
    message: str


@dataclass(frozen=True)
class JobEnded:
    cancelled: bool


@dataclass(frozen=True)
class AttachmentRead:
    """A file read for the chat's composer (app/store/attachments.py), or why it could not be.
    ``key`` names the chip it belongs to; ``attachment`` is None when ``error`` says why."""

    key: int
    name: str
    attachment: object = None  # app.store.attachments.Attachment, with its tokens counted when a model is loaded
    error: str = ""


@dataclass(frozen=True)
class PromptBudget:
    """How many tokens a chat request would read, against the loaded model's context window.
    ``prompt_tokens`` is None when no local tokenizer can count them (a remote model);
    ``window`` is None when the model does not say its context length. ``attachments``: the
    tokens of each file attached to the new message, in order."""

    prompt_tokens: int | None
    window: int | None
    attachments: tuple = ()
    error: str = ""  # the request cannot be encoded at all (the engine's reason)


@dataclass(frozen=True)
class ToolConfirm:
    """The model called ``name`` of the MCP server ``server`` with ``arguments`` (JSON text); the
    worker waits until the window puts True (run it) or False (decline) on ``answer``."""

    name: str
    arguments: str
    server: str
    answer: object = field(compare=False, repr=False)  # queue.Queue[bool], read by the worker


@dataclass(frozen=True)
class ToolNotice:
    """Something about the chat's tools the person should know (a server that did not start)."""

    text: str


@dataclass(frozen=True)
class DrafterTrained:
    """A drafter training run ended (finished, or stopped with the best drafter so far kept):
    where it is, for which target, and what it reached on the held-out texts."""

    out: str
    target_path: str
    message: str
    best_tokens_per_pass: float | None
    stopped: bool
    #: False when nothing usable was saved (stopped before the first scoring, too little data).
    saved: bool = True
