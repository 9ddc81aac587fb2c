"""The work the engine thread does for the window. Each factory returns ``run(ctx)`` for
``EngineHost.submit``. Everything heavy (torch, transformers, the engine's model code) is
imported inside these functions, on the worker thread."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from app.messages import DrafterNote, MachineReport, ModelLoaded, Progress
from engine.core.settings import DecodeSettings

log = logging.getLogger(__name__)
SESSION = "session"


def _session(ctx):
    session = ctx.state.get(SESSION)
    if session is None:
        raise ValueError("no model is loaded yet: load one on the Models tab")
    return session


def probe_machine(context: int):
    """Hardware, memory fit of every catalog entry at ``context`` tokens, what is installed."""

    def run(ctx) -> None:
        from engine.models import default_pair

        ready = default_pair.installed_paths() is not None
        try:
            from engine.models.catalog import load_catalog
            from engine.models.fit import recommend
            from engine.models.hardware import detect_hardware

            hardware = detect_hardware()
            entries = load_catalog()
            fits = tuple(recommend(entries, hardware, context))
            installed = frozenset(e.id for e in entries if _installed(e, ready))
            ctx.emit(MachineReport(hardware, fits, installed, ready))
        except Exception as exc:  # the picker says what went wrong; loading still works
            log.exception("machine probe failed")
            ctx.emit(MachineReport(None, (), frozenset(), ready, error=f"{type(exc).__name__}: {exc}"))

    return run


def _installed(entry, default_ready: bool) -> bool:
    if entry.id == "default-offline":
        return default_ready
    try:
        from engine.hub.download import is_installed
    except ImportError:
        return False
    return is_installed(entry.target_repo) is not None


def load_models(target: str | None = None, drafter: str | None = None, precision: str = "fast", device: str = "auto"):
    """Load a target (and drafter) from folders; ``target=None`` means the default offline
    pair, prepared from the installed packages when needed."""

    def run(ctx) -> None:
        from engine.models import default_pair

        ctx.state.pop(SESSION, None)  # free the old models before loading new ones
        if target is None:
            def progress(stage: str, done: int, total: int) -> None:
                ctx.emit(Progress(_STAGES.get(stage, stage), done, total, "bytes" if total > 1 else ""))

            paths = [default_pair.prepare(spec, progress) for spec in (default_pair.TARGET, default_pair.DRAFTER)]
            target_path, drafter_path = paths
        else:
            target_path, drafter_path = Path(target), Path(drafter) if drafter else None
        if ctx.cancelled():
            return
        ctx.emit(Progress("Loading model", 0, 0))
        start = time.perf_counter()
        from engine.session.compare import warm_up
        from engine.session.session import Session

        session = Session.load(target_path, drafter_path, precision, device)
        kind, note = default_drafter(session)
        ctx.emit(Progress("Warming up", 0, 0))
        warm_up(session, kind)
        ctx.state[SESSION] = session
        ctx.emit(ModelLoaded(
            target=session.target.name,
            drafter=session.drafter_model.name if session.drafter_model else None,
            precision=session.precision,
            device=str(session.target.device),
            seconds=time.perf_counter() - start,
            target_path=str(target_path),
            drafter_path=str(drafter_path or ""),
            drafter_kind=kind,
            note=note,
        ))

    return run


_STAGES = {"assemble": "Assembling model files", "verify": "Verifying checksums", "convert": "Converting to safetensors"}


def default_drafter(session) -> tuple[str, str | None]:
    """The drafter to use for a loaded session, and a note when it is not a separate model:
    its draft model or assistant; else the target's own MTP layers; else prompt lookup."""
    if session.model_drafter is not None:
        return "model", None
    from engine.drafters.mtp_layers import inspect_mtp

    support = inspect_mtp(session.target.model)
    if support.usable:
        return "mtp", f"{session.target.name} drafts with its own MTP layers"
    return "lookup", "no drafter model is loaded: drafting by prompt lookup"


def _emit_note(ctx, session, before: str | None) -> None:
    if session.drafter_note and session.drafter_note != before:
        ctx.emit(DrafterNote(session.drafter_note))


def side_by_side(prompt: str, settings: DecodeSettings, drafter: str):
    def run(ctx) -> None:
        from engine.session.side_by_side import side_by_side as run_both

        session = _session(ctx)
        before = session.drafter_note
        for item in run_both(session, prompt, settings, drafter, ctx.cancelled):
            _emit_note(ctx, session, before)  # the drafter is chosen when the first step runs
            before = session.drafter_note
            ctx.emit(item)

    return run


def chat(messages: list[dict], settings: DecodeSettings, drafter: str):
    def run(ctx) -> None:
        from engine.session.chat import chat_reply

        session = _session(ctx)
        before = session.drafter_note
        for item in chat_reply(session, messages, settings, drafter, ctx.cancelled):
            _emit_note(ctx, session, before)
            before = session.drafter_note
            ctx.emit(item)

    return run
