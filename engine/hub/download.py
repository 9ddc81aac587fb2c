"""Hub downloads: a model and its matching drafter, with progress, cancel, resume and checks.

Two steps, both usable from a Qt worker thread or the CLI:

* ``plan_download(repo_or_id, ...)`` (``engine.hub.plan``) decides what to fetch, with no
  network at all for models already installed.
* ``download_events(plan, cancel)`` is a generator of frozen events (``engine.hub.events``):
  ``DownloadStarted``, ``DownloadProgress`` a few times a second, then ``DownloadFinished`` or
  ``DownloadFailed``. It checks free disk space first, fetches the small files (configs,
  tokenizers) of both models first so that a drafter with another tokenizer is refused before
  the weights are fetched, verifies every file against the Hub's hashes and only then marks the
  models installed.

The transfer runs on a worker thread (``engine.hub.transfer``) and the generator only watches
it, so a cancel is answered within a fraction of a second even while the worker is blocked on a
slow read; the abandoned worker stops at its next chunk and leaves its partial file for a resume.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.hub import cache as hub_cache
from engine.hub import vocab_match
from engine.hub.cache import is_installed, read_installed
from engine.hub.events import (
    DownloadEvent,
    DownloadFailed,
    DownloadFinished,
    DownloadNotice,
    DownloadProgress,
    DownloadStarted,
    FailureKind,
)
from engine.hub.files import HubFile
from engine.hub.gguf_plan import plan_gguf_download, plan_variant_download
from engine.hub.plan import (
    DownloadPlan,
    HubError,
    RepoDownload,
    disk_free_bytes,
    hub_error,
    plan_download,
)
from engine.hub.safe_names import UnsafeName
from engine.hub.transfer import (
    Progress,
    Transfer,
    ensure_file,
    present_bytes,
)

__all__ = [
    "DownloadEvent", "DownloadFailed", "DownloadFinished", "DownloadNotice", "DownloadPlan", "DownloadProgress",
    "DownloadStarted", "FailureKind", "HubError", "RepoDownload", "download", "download_events",
    "fetch_events", "is_installed", "plan_download", "plan_for", "plan_gguf_download", "plan_variant_download",
]

log = logging.getLogger(__name__)
PROGRESS_INTERVAL_S = 0.25  # at most ~4 progress events a second: enough for a smooth bar
POLL_S = 0.05               # how often the generator looks at the cancel flag
CANCEL_GRACE_S = 0.5        # how long a cancel waits for the worker before abandoning it
DISK_HEADROOM = 64 << 20    # keep a little space free beyond the download itself
RATE_WINDOW_S = 3.0


def _bytes_present(plan: DownloadPlan) -> int:
    return sum(present_bytes(plan.cache, u.repo, f) for u in plan.units for f in u.files)


def _check_vocab(plan: DownloadPlan) -> bool | None:
    d = plan.drafter
    if d is None or d.repo == plan.target.repo:
        return None  # no drafter, or one stored in the target's own repo
    if plan.drafter_kind in ("eagle3", "dflash"):
        return _check_made_for_target(plan)
    if d.entry_file or plan.target.entry_file:
        return None  # GGUF files carry their tokenizer inside: Session.load compares them
    check = vocab_match.compare(plan.target.path(plan.cache), d.path(plan.cache), plan.target.repo, d.repo)
    if check.same:
        return True
    if plan.cross_tokenizer:
        log.warning("%s; fetching it anyway (cross-tokenizer drafting)", check.reason)
        return False
    raise HubError(
        f"{check.reason}. A draft model must share the target's tokenizer to draft for it. Choose a"
        " matching drafter, or ask for cross-tokenizer drafting explicitly (--cross-tokenizer).", "mismatch")


def _check_made_for_target(plan: DownloadPlan) -> bool:
    """Before its weights: the drafter's config is an EAGLE-3 / DFlash one, for the target's
    vocabulary where the target's config says it (a GGUF target's is checked at load, where
    engine.drafters also checks the rest: verifier, hidden size, layers)."""
    from engine.models.planning.local_config import read_config
    from engine.models.planning.speculators_config import SpeculatorError, parse_speculator

    d = plan.drafter
    try:
        spec = parse_speculator(read_config(d.path(plan.cache)) or {}, d.repo)
    except SpeculatorError as exc:
        raise HubError(f"{exc}; the catalog pairs it with {plan.target.repo} as {plan.drafter_kind}", "mismatch") from exc
    if plan.target.entry_file is None:
        target_vocab = vocab_match.config_vocab_size(plan.target.path(plan.cache))
        if target_vocab is not None and target_vocab != spec.layers.vocab_size:
            raise HubError(f"{d.repo} drafts over {spec.layers.vocab_size:,} token ids, {plan.target.repo} has"
                           f" {target_vocab:,}: it was made for another model", "mismatch")
    return True


def _fetch_all(plan: DownloadPlan, t: Transfer) -> bool | None:
    """The worker: every file of every unit, small files first, then markers. Returns whether
    the drafter shares the target's tokenizer (None: no separate drafter)."""
    todo = [u for u in plan.units if not (u.installed and read_installed(u.repo, u.subfolder, u.revision, u.precision))]
    small = [(u, f) for u in todo for f in u.files if not f.is_weights]
    large = [(u, f) for u in todo for f in u.files if f.is_weights]
    for u, f in small:
        _ensure(t, u, f)
    same = _check_vocab(plan)
    for u, f in large:
        _ensure(t, u, f)
    for u in todo:
        hub_cache.write_ref(plan.cache, u.repo, u.revision, u.commit)
        hub_cache.write_marker(plan.cache, u.repo, u.revision, u.commit, u.subfolder, u.files, u.precision,
                               u.entry_file)
    if plan.drafter is not None and plan.drafter.entry_file is None:  # a GGUF pair comes from the catalog
        hub_cache.remember_pair(plan.target.repo, plan.drafter.repo, plan.drafter.subfolder, plan.drafter_kind or "draft_model")
    return same


def _ensure(t: Transfer, u: RepoDownload, f: HubFile) -> None:
    try:
        ensure_file(t, u.repo, u.commit, f)
    except Exception as exc:
        raise hub_error(exc, u.repo, t.endpoint, f.path) from exc


class _RateMeter:
    """Bytes per second over the last few seconds of received data."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()

    def rate(self, now: float, received: int) -> float:
        self.samples.append((now, received))
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()
        t0, r0 = self.samples[0]
        return (received - r0) / (now - t0) if now - t0 > 0.1 else 0.0


def _progress(plan: DownloadPlan, p: Progress, rate: float) -> DownloadProgress:
    total = plan.total_bytes
    done = min(p.done, total)
    eta = (total - done) / rate if rate > 0 else None
    return DownloadProgress(done, total, rate, eta, p.current)


def download_events(plan: DownloadPlan, cancel: threading.Event, *,
                    free_bytes: Callable[[Path], int] = disk_free_bytes) -> Iterator[DownloadEvent]:
    """Fetch ``plan``, yielding events; ends with ``DownloadFinished`` or ``DownloadFailed``.

    Setting ``cancel`` ends the generator within about a second with a "cancelled" failure; the
    bytes fetched so far stay on disk and the next call resumes from them. ``free_bytes`` tells
    the free space at a path (replaceable for tests)."""
    started = time.monotonic()
    try:
        progress = Progress(done=_bytes_present(plan))
    except UnsafeName as exc:  # a plan built by hand, past plan_download's checks
        yield DownloadFailed(str(exc), "unsafe")
        return
    missing = plan.total_bytes - progress.done
    free = free_bytes(plan.cache)
    if missing > 0 and missing + DISK_HEADROOM > free:
        yield DownloadFailed(
            f"Not enough disk space to download {_label(plan.target)}: {_size(missing)} more is needed in"
            f" {plan.cache} (plus {_size(DISK_HEADROOM)} to spare) but only {_size(free)} is free."
            " Free some space, or set HF_HOME to a folder on a larger disk.", "disk_full")
        return
    drafter_repo = plan.drafter.repo if plan.drafter else None
    yield DownloadStarted(plan.files, plan.total_bytes, progress.done, plan.target.repo, drafter_repo)

    stop = threading.Event()
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["same_tokenizer"] = _fetch_all(plan, Transfer(plan.endpoint, plan.cache, plan.token, stop, progress))
        except BaseException as exc:  # reported by the generator, never lost on the thread
            outcome["error"] = hub_error(exc, plan.target.repo, plan.endpoint)

    worker = threading.Thread(target=work, name="tandem-hub-download", daemon=True)
    worker.start()
    meter, last, told = _RateMeter(), 0.0, 0
    try:
        while worker.is_alive():
            worker.join(POLL_S)
            while told < len(progress.notices):
                told += 1
                yield DownloadNotice(progress.notices[told - 1])
            if cancel.is_set() and worker.is_alive():
                stop.set()
                worker.join(CANCEL_GRACE_S)
                if worker.is_alive():
                    log.info("download worker is blocked in I/O; abandoning it (it stops at its next chunk)")
                yield DownloadFailed(f"download of {plan.target.repo} cancelled; run it again to resume", "cancelled")
                return
            now = time.monotonic()
            if now - last >= PROGRESS_INTERVAL_S and worker.is_alive():
                last = now
                yield _progress(plan, progress, meter.rate(now, progress.received))
    finally:
        stop.set()  # also when the consumer stops iterating early: let the worker wind down
    for message in progress.notices[told:]:
        yield DownloadNotice(message)
    error = outcome.get("error")
    if isinstance(error, HubError):
        yield DownloadFailed(str(error), error.kind)
        return
    yield DownloadProgress(plan.total_bytes, plan.total_bytes, meter.rate(time.monotonic(), progress.received), 0.0, "")
    yield DownloadFinished(
        target_path=plan.target.load_path(plan.cache),
        drafter_path=plan.drafter.load_path(plan.cache) if plan.drafter else None,
        drafter_kind=plan.drafter_kind,
        same_tokenizer=outcome.get("same_tokenizer"),
        bytes_downloaded=progress.received,
        seconds=time.monotonic() - started,
    )


def plan_for(repo_or_id: str, variant: str | None = None, **plan_options) -> DownloadPlan:
    """``plan_download`` (a model folder), or with ``variant`` (a GGUF quantization the catalog
    lists for ``repo_or_id``, e.g. "Q4_K_M") ``plan_variant_download``: that file and its
    drafter's GGUF file only."""
    if variant is None:
        return plan_download(repo_or_id, **plan_options)
    folder_only = sorted(k for k in ("precision", "drafter_repo", "cross_tokenizer") if plan_options.get(k))
    if folder_only:
        raise HubError(f"{', '.join(folder_only)} apply to safetensors downloads, not to the GGUF variant {variant}",
                       "not_found")
    return plan_variant_download(repo_or_id, variant, plan_options.get("drafter", True),
                                 revision=plan_options.get("revision", "main"), token=plan_options.get("token"))


def fetch_events(repo_or_id: str, cancel: threading.Event, **plan_options) -> Iterator[DownloadEvent]:
    """``plan_for`` then ``download_events`` as one generator: planning errors come out as
    ``DownloadFailed`` too (the shape the Qt worker wants)."""
    try:
        plan = plan_for(repo_or_id, **plan_options)
    except HubError as exc:
        yield DownloadFailed(str(exc), exc.kind)
        return
    yield from download_events(plan, cancel)


def download(repo_or_id: str, *, drafter: bool = True, precision: str | None = None, drafter_repo: str | None = None,
             cross_tokenizer: bool = False, revision: str = "main", token: str | bool | None = None,
             variant: str | None = None, cancel: threading.Event | None = None,
             on_event: Callable[[DownloadEvent], None] | None = None) -> DownloadFinished:
    """Blocking form: returns the ``DownloadFinished`` event or raises ``HubError``."""
    plan = plan_for(repo_or_id, variant, drafter=drafter, precision=precision, drafter_repo=drafter_repo,
                    cross_tokenizer=cross_tokenizer, revision=revision, token=token)
    for event in download_events(plan, cancel or threading.Event()):
        if on_event is not None:
            on_event(event)
        if isinstance(event, DownloadFailed):
            raise HubError(event.error, event.kind)
        if isinstance(event, DownloadFinished):
            return event
    raise RuntimeError("download_events ended without a result")  # pragma: no cover


def _label(u: RepoDownload) -> str:
    return f"{u.repo} ({u.precision} GGUF)" if u.entry_file else u.repo


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover
