"""The work the engine thread does for the window. Each factory returns ``run(ctx)`` for
``EngineHost.submit``. Everything heavy (torch, transformers, the engine's model code) is
imported inside these functions, on the worker thread."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from app.bridge import tool_jobs
from app.bridge.messages import (
    AttachmentRead,
    DrafterNote,
    KernelReport,
    MachineReport,
    ModelLoaded,
    Progress,
    PromptBudget,
)
from app.bridge.remote_jobs import remote_chat
from app.bridge.shared_engine import holding
from engine.core.settings import DecodeSettings

log = logging.getLogger(__name__)


def _session(ctx):
    session = ctx.state.session
    if session is None:
        raise ValueError("no model is loaded yet: load one on the Models tab")
    return session


def probe_machine(context: int):
    """Hardware, memory fit of every catalog entry at ``context`` tokens, what is installed."""

    def run(ctx) -> None:
        from engine.models.loading import default_pair

        ready = default_pair.installed_paths() is not None
        try:
            from engine.models.loading.machine import detect_machine
            from engine.models.planning.catalog import load_catalog
            from engine.models.planning.fit import recommend

            hardware = detect_machine()
            entries = load_catalog()
            fits = tuple(recommend(entries, hardware, context))
            installed = frozenset(e.id for e in entries if _installed(e, ready))
            offline = hub_unreachable() if not installed else ""
            ctx.emit(MachineReport(hardware, fits, installed, ready, offline=offline))
        except Exception as exc:  # the picker says what went wrong; loading still works
            log.exception("machine probe failed")
            ctx.emit(MachineReport(None, (), frozenset(), ready, error=f"{type(exc).__name__}: {exc}"))

    return run


HUB_HOST = ("huggingface.co", 443)
HUB_PROBE_S = 1.5  # a first run must say "no network" at once, never after a long wait


def hub_unreachable(probe_s: float = HUB_PROBE_S) -> str:
    """Why the Hub cannot be reached, or "" when a connection opens within ``probe_s`` seconds.
    The probe runs in a daemon thread: a hanging DNS lookup cannot hold the caller past it."""
    import os
    import socket
    import threading

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    outcome: list[str] = []

    def probe() -> None:
        try:
            socket.create_connection(HUB_HOST, timeout=probe_s).close()
            outcome.append("")
        except OSError as exc:
            outcome.append(f"{HUB_HOST[0]} cannot be reached ({exc})")

    thread = threading.Thread(target=probe, daemon=True, name="hub-probe")
    thread.start()
    thread.join(probe_s + 0.2)
    return outcome[0] if outcome else f"{HUB_HOST[0]} did not answer within {probe_s:.1f} s"


def kernel_report():
    def run(ctx) -> None:
        import kernels

        ctx.emit(KernelReport(kernels.cpu_kernel_report()))

    return run


def _installed(entry, default_ready: bool) -> bool:
    if entry.id == "default-offline":
        return default_ready
    try:
        from engine.hub.download import is_installed
    except ImportError:
        return False
    return is_installed(entry.target_repo) is not None


def load_models(target: str | None = None, drafter: str | None = None, precision: str = "bf16", device: str = "auto",
                settings=None, race_with: str | None = None):
    """Load a target (and drafter) from folders; ``target=None`` means the default offline
    pair, prepared from the installed packages when needed. ``settings``: the model's own
    (app.picker.model_settings.ModelSettings): its precision wins, its thread count is set on the
    engine thread, a drafter choice other than "model" loads no draft model; they come back
    in ModelLoaded for the window to apply to the decode controls. ``race_with``: a draft model
    to load beside a drafter made for the target (the one trained here), which the demo races;
    the model's own draft model is loaded so with "Trained here"."""
    if settings is not None and settings.precision:
        precision = settings.precision
    # "trained": the drafter trained here for the model (Model > Train a drafter…), where there is one.
    skip_drafter = settings is not None and settings.drafter not in ("model", "trained")

    def run(ctx) -> None:
        from engine.models.loading import default_pair


        # The server decodes on the old Session: it stops with it; the old models (or the
        # remote one) are freed before new ones load.
        ctx.state.drop_model()
        if target is None:
            def progress(stage: str, done: int, total: int) -> None:
                ctx.emit(Progress(_STAGES.get(stage, stage), done, total, "bytes" if total > 1 else ""))

            # "file" runs the target's GGUF file; the other precisions its converted folder.
            target_path, drafter_path = default_pair.prepare_pair(precision, not skip_drafter, progress)
        else:
            target_path, drafter_path = Path(target), Path(drafter) if drafter and not skip_drafter else None
        trained_note = None
        beside = Path(race_with) if race_with else None
        if settings is not None and settings.drafter == "trained":
            usual = drafter_path
            drafter_path, trained_note = _trained_drafter(target_path, drafter_path)
            if beside is None and usual is not None and drafter_path != usual:
                beside = usual  # the draft model it replaces, to race it against
        if ctx.cancelled():
            return
        import torch

        if settings is not None and settings.threads:
            torch.set_num_threads(settings.threads)
        ctx.emit(Progress("Loading model", 0, 0))
        start = time.perf_counter()
        from engine.drafters import DrafterMismatch
        from engine.session.compare import warm_up
        from engine.session.session import Session

        refused = None
        try:
            session = Session.load(target_path, drafter_path, precision, device, draft_model_path=beside)
        except DrafterMismatch as exc:  # the target still runs: plain or by prompt lookup
            refused = str(exc)
            log.warning("drafter refused: %s", refused)
            session = Session.load(target_path, None, precision, device)
        resident = None
        if settings is not None and settings.keep_in_ram:
            from engine.gguf.resident import CannotKeepResident

            try:
                resident = session.keep_weights_resident().describe()
            except CannotKeepResident as exc:
                resident = str(exc)
                log.warning("keep in RAM: %s", exc)
        kind, note = default_drafter(session)
        note = " ".join(n for n in (trained_note, note) if n) or None
        draft_model = session.draft_model_name
        racing = session.has_draft_model_beside
        draft_model_path = "" if draft_model is None else str(beside if racing else drafter_path)
        ctx.emit(Progress("Warming up", 0, 0))
        warm_up(session, kind)
        ctx.state.session = session
        ctx.emit(ModelLoaded(
            target=session.target.name,
            drafter=session.drafter_name,
            precision=session.precision,
            device=str(session.target.device),
            seconds=time.perf_counter() - start,
            target_path=str(target_path),
            drafter_path=str(drafter_path or ""),
            drafter_kind=kind,
            note=note,
            drafter_refused=refused,
            settings=settings,
            threads=torch.get_num_threads(),
            resident=resident,
            draft_model_path=draft_model_path,
            race_against=draft_model if racing else None,
        ))

    return run


_STAGES = {"assemble": "Assembling model files", "verify": "Verifying checksums", "convert": "Converting to safetensors"}


def _trained_drafter(target_path: Path, drafter_path: Path | None) -> tuple[Path | None, str | None]:
    """(the drafter to load, a note): the one trained here beside the model, else the model's
    own drafter with a note that none was trained yet."""
    from app.bridge.distill_jobs import default_drafter_folder

    trained = default_drafter_folder(target_path)
    if (trained / "config.json").is_file():
        return trained, None
    return drafter_path, "no drafter was trained for this model yet (Model > Train a drafter): its usual drafter drafts."


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
        with holding(ctx.state.generation_lock, ctx.cancelled) as held:  # the server may be decoding
            if not held:
                return
            # "race": the drafter made for the target against the draft model loaded beside it.
            lanes = ("model", "draft_model") if drafter == "race" else (drafter, "off")
            for item in run_both(session, prompt, settings, lanes[0], ctx.cancelled, against=lanes[1]):
                _emit_note(ctx, session, before)  # the drafter is chosen when the first step runs
                before = session.drafter_note
                ctx.emit(item)

    return run


def chat(messages: list[dict], settings: DecodeSettings, drafter: str, tools=None):
    """A chat turn; ``tools`` (app.store.tool_settings.ToolSettings): the MCP servers whose tools the
    model may call (app/bridge/tool_jobs.py), each call confirmed first where it says so."""

    def run(ctx) -> None:
        from engine.session.chat import chat_reply, chat_with_tools

        if ctx.state.session is None and ctx.state.remote is not None:  # a remote model is the window's model
            remote_chat(ctx, ctx.state.remote, messages, settings)
            return
        session = _session(ctx)
        configs = tools.configs() if tools is not None else ()
        offered = tool_jobs.tools_for_turn(ctx, configs) if configs and tool_jobs.model_takes_tools(ctx, session) else []
        before = session.drafter_note
        with holding(ctx.state.generation_lock, ctx.cancelled) as held:  # the server may be decoding
            if not held:
                return
            if offered:
                turn = chat_with_tools(session, messages, settings, offered, tool_jobs.tool_runner(ctx, tools.confirm),
                                       drafter, ctx.cancelled)
            else:
                turn = chat_reply(session, messages, settings, drafter, ctx.cancelled)
            for item in turn:
                _emit_note(ctx, session, before)
                before = session.drafter_note
                ctx.emit(item)

    return run


# --- attachments: read and counted here, off the GUI thread ------------------------------------
def count_tokens(ctx, text: str) -> int | None:
    """Tokens of ``text`` with the loaded model's tokenizer; None when no local model is loaded."""
    session = ctx.state.session
    if session is None:
        return None
    try:
        return len(session.tokenizer(text, add_special_tokens=False)["input_ids"])
    except TypeError:  # a tokenizer without the keyword
        return len(session.tokenizer(text)["input_ids"])


def context_window(session) -> int | None:
    """The target's context length (max_position_embeddings), when its config says it."""
    config = getattr(session.target.model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text_config, "max_position_embeddings", None)
    return window if isinstance(window, int) and window > 0 else None


def read_attachment(key: int, path: str | None = None, attachment=None):
    """Read the file ``path`` (or take ``attachment`` as it is) and count its block's tokens."""

    def run(ctx) -> None:
        from dataclasses import replace

        from app.store.attachments import AttachmentError, block
        from app.store.attachments import read_attachment as read

        item = attachment
        if item is None:
            try:
                item = read(Path(path))
            except AttachmentError as exc:
                ctx.emit(AttachmentRead(key, Path(path).name, error=str(exc)))
                return
        ctx.emit(AttachmentRead(key, item.name, replace(item, tokens=count_tokens(ctx, block(item)))))

    return run


def prompt_budget(messages: list[dict], attachments: tuple = ()):
    """The tokens ``messages`` make through the chat template, the context window, and the
    tokens of each of ``attachments`` (the new message's files)."""

    def run(ctx) -> None:
        from app.store.attachments import block

        session = ctx.state.session
        if session is None:
            ctx.emit(PromptBudget(None, None, tuple(a.tokens for a in attachments)))
            return
        counts = tuple(count_tokens(ctx, block(a)) for a in attachments)
        try:
            tokens = len(session.encode(messages))
        except ValueError as exc:  # the engine's own refusal (an empty or invalid message)
            ctx.emit(PromptBudget(None, context_window(session), counts, error=str(exc)))
            return
        ctx.emit(PromptBudget(tokens, context_window(session), counts))

    return run
