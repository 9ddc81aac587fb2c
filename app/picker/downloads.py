"""Downloads from the Hugging Face Hub, as the window sees them: a job, its progress, the paths
of what is installed. engine.hub.download does the work (it is torch-free, so the GUI thread may ask it
what is installed)."""
from __future__ import annotations

from app.bridge.messages import Progress

RUNNABLE_DRAFTERS = {"draft_model"}  # kinds the engine can load as a separate drafter today
# Drafters made for their target (EAGLE-3, DFlash): a checkpoint folder of their own, fetched
# with the target whatever its variant (they have no GGUF files).
MADE_FOR_TARGET = {"eagle3", "dflash"}


def installed_paths(entry, variant=None):
    """(target dir, drafter dir or None) when the target is installed and verified, else None.
    A drafter kind the engine cannot run yet is skipped (prompt lookup drafts instead).
    ``variant`` (an engine.models.planning.variants.GgufVariant of the entry): its GGUF file instead, and
    the drafter's GGUF file that ``tandem download --variant`` pairs with it."""
    from engine.hub.download import is_installed

    if variant is not None:
        from engine.hub.gguf_plan import drafter_variant_for

        target = is_installed(variant.repo, precision=variant.quant)
        if target is None:
            return None
        if entry.drafter_kind in MADE_FOR_TARGET:
            return target, is_installed(entry.drafter_repo)
        paired = drafter_variant_for(entry, variant) if entry.drafter_kind in RUNNABLE_DRAFTERS else None
        return target, is_installed(paired.repo, precision=paired.quant) if paired is not None else None
    target = is_installed(entry.target_repo)
    if target is None:
        return None
    drafter = None
    if entry.drafter_repo and entry.drafter_kind in RUNNABLE_DRAFTERS | MADE_FOR_TARGET:
        drafter = is_installed(entry.drafter_repo)
    return target, drafter


def download_job(entry, variant: str | None = None):
    """The download of ``entry``: its GGUF ``variant`` ("Q4_K_M": that file and its drafter's
    GGUF file, as ``tandem download --variant``), else the repo's own weights and drafter."""

    def run(ctx) -> None:
        from engine.hub.download import fetch_events

        if variant is not None:
            for event in fetch_events(entry.id, ctx.job.cancel_flag, variant=variant, drafter=True):
                ctx.emit(event)
            return
        if entry.drafter_kind in MADE_FOR_TARGET:  # the catalog's pairing, by the entry's id
            for event in fetch_events(entry.id, ctx.job.cancel_flag, drafter=True):
                ctx.emit(event)
            return
        wants_drafter = bool(entry.drafter_repo) and entry.drafter_kind in ("draft_model", "assistant")
        options = {"drafter": wants_drafter}
        if wants_drafter:
            options["drafter_repo"] = entry.drafter_repo
        for event in fetch_events(entry.target_repo, ctx.job.cancel_flag, **options):
            ctx.emit(event)

    return run


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def describe_download_event(event) -> tuple[Progress | None, str]:
    """(progress to show or None, error message or "") for one engine.hub.download event."""
    from engine.hub.events import DownloadFailed, DownloadFinished, DownloadProgress, DownloadStarted

    if isinstance(event, DownloadStarted):
        return Progress("Downloading", event.bytes_present, event.total_bytes, "bytes",
                        f"{len(event.files)} files"), ""
    if isinstance(event, DownloadProgress):
        rate = f"{event.rate_bps / 1024**2:.1f} MB/s"
        return Progress("Downloading", event.bytes_done, event.bytes_total, "bytes",
                        f"{rate} · ETA {_duration(event.eta_s)} · {event.current_file}"), ""
    if isinstance(event, DownloadFailed):
        return None, "" if event.kind == "cancelled" else event.error
    if isinstance(event, DownloadFinished):
        return Progress("Downloaded", 1, 1), ""
    return None, ""
