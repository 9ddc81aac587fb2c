"""`tandem download`: a model and its matching drafter from the Hugging Face Hub, with a
progress bar; Ctrl-C stops cleanly and the same command resumes.

A catalog model with GGUF variants downloads one of them (``--variant Q4_K_M``; by default the
first the catalog lists): that file and its drafter's GGUF file only, ready for precision
"file". ``--variant safetensors``, or a model without GGUF variants, fetches the repo's own
weights as before."""
from __future__ import annotations

import sys

from engine.cli.common import human_size


class _DownloadBar:
    """One terminal line: bar, percent, bytes, rate, ETA and the file being fetched."""

    WIDTH = 28

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.shown = False

    def show(self, done: int, total: int, rate: float, eta: float | None, current: str) -> None:
        frac = done / total if total else 1.0
        filled = int(self.WIDTH * frac)
        eta_text = "--:--" if eta is None else f"{int(eta) // 60:d}:{int(eta) % 60:02d}"
        name = current.rsplit("/", 1)[-1][-24:]
        line = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {frac:4.0%} {human_size(done)}/{human_size(total)}"
                f"  {human_size(rate)}/s  ETA {eta_text}  {name}")
        print(f"\r{line:<100}", end="", file=self.stream, flush=True)
        self.shown = True

    def end(self) -> None:
        if self.shown:
            print(file=self.stream, flush=True)
            self.shown = False


SAFETENSORS = ("safetensors", "none")  # --variant values that ask for the repo's own weights


def _variant(args) -> str | None:
    """The GGUF variant to fetch: the one asked for, else the catalog's first where the model
    has some and nothing safetensors-only was asked for; None: the repo's own weights."""
    from engine.hub.gguf_plan import catalog_variants
    from engine.hub.plan import catalog_entry

    if args.variant is not None:
        return None if args.variant.strip().lower() in SAFETENSORS else args.variant
    if args.precision or args.drafter or args.cross_tokenizer:
        return None
    entry = catalog_entry(args.model)
    variants = catalog_variants(entry)[0] if entry is not None else ()
    if variants:
        print(f"variant: {variants[0].quant} (GGUF; also {', '.join(v.quant for v in variants[1:]) or 'none'};"
              " --variant to choose, --variant safetensors for the repo's own weights)", file=sys.stderr)
        return variants[0].quant
    return None


def run(args) -> int:
    """Fetch a model and its drafter from the Hub. Ctrl-C stops cleanly; running the same
    command again resumes from the bytes already on disk."""
    import signal
    import threading

    from engine.hub.download import (
        DownloadFailed,
        DownloadFinished,
        DownloadNotice,
        DownloadProgress,
        DownloadStarted,
        HubError,
        download_events,
        plan_for,
    )

    try:  # the revision, the repo and everything the Hub answers are checked here
        plan = plan_for(args.model, _variant(args), drafter=not args.no_drafter, precision=args.precision,
                        drafter_repo=args.drafter, cross_tokenizer=args.cross_tokenizer, revision=args.revision)
    except HubError as exc:
        print(f"tandem: error ({exc.kind}): {exc}", file=sys.stderr)
        return 1
    bar = _DownloadBar()
    what = f"{plan.target.precision} GGUF, " if plan.target.entry_file else ""
    print(f"target:  {plan.target.repo} ({what}{len(plan.target.files)} files, {human_size(plan.target.size)})"
          + (" - installed" if plan.target.installed else ""), file=sys.stderr)
    if plan.drafter is not None:
        where = plan.drafter.repo + (f"/{plan.drafter.subfolder}" if plan.drafter.subfolder else "")
        print(f"drafter: {where} ({plan.drafter_kind}, {plan.drafter_source}; {len(plan.drafter.files)} files,"
              f" {human_size(plan.drafter.size)})" + (" - installed" if plan.drafter.installed else ""), file=sys.stderr)
    elif not args.no_drafter:
        print(f"drafter: none found ({plan.drafter_kind or 'prompt lookup will be used'})", file=sys.stderr)

    cancel = threading.Event()
    # Ctrl-C sets the cancel flag instead of raising inside the download: it then stops the
    # worker, keeps the partial file for a resume, and reports normally.
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    try:
        for event in download_events(plan, cancel):
            if isinstance(event, DownloadStarted) and 0 < event.bytes_present < event.total_bytes:
                print(f"resuming: {human_size(event.bytes_present)} of {human_size(event.total_bytes)} already here", file=sys.stderr)
            elif isinstance(event, DownloadProgress):
                bar.show(event.bytes_done, event.bytes_total, event.rate_bps, event.eta_s, event.current_file)
            elif isinstance(event, DownloadNotice):
                bar.end()
                print(f"note: {event.message}", file=sys.stderr)
            elif isinstance(event, DownloadFailed):
                bar.end()
                if event.kind == "cancelled":
                    print("cancelled; run the same command again to resume", file=sys.stderr)
                    return 130
                print(f"tandem: error ({event.kind}): {event.error}", file=sys.stderr)
                return 1
            elif isinstance(event, DownloadFinished):
                bar.end()
                print(f"done in {event.seconds:.1f}s ({human_size(event.bytes_downloaded)} downloaded)", file=sys.stderr)
                print(f"target: {event.target_path}")
                if event.drafter_path is not None:
                    print(f"drafter: {event.drafter_path}")
                    if event.same_tokenizer is False:
                        print("note: the drafter uses a different tokenizer (cross-tokenizer drafting)", file=sys.stderr)
                return 0
    finally:
        signal.signal(signal.SIGINT, previous)
    return 1


def add_parser(sub) -> None:
    p = sub.add_parser("download", help="fetch a model and its matching drafter from the Hugging Face Hub")
    p.add_argument("model", metavar="REPO_OR_CATALOG_ID")
    p.add_argument("--no-drafter", action="store_true", help="fetch the target only")
    p.add_argument("--drafter", metavar="REPO", help="use this drafter repo instead of the catalog pairing")
    p.add_argument("--cross-tokenizer", action="store_true",
                   help="accept a drafter whose tokenizer differs from the target's")
    p.add_argument("--variant", default=None, metavar="QUANT",
                   help="a GGUF variant from the catalog, e.g. Q4_K_M: only that file and its drafter's GGUF file"
                        " (default: the catalog's first, where the model has any; 'safetensors' for the repo's own)")
    p.add_argument("--precision", default=None, metavar="VARIANT",
                   help="weight variant: default the repo's own safetensors; e.g. fp16, or a GGUF quant like Q4_K_M"
                        " for a repo of GGUF files only")
    p.add_argument("--revision", default="main", help="branch, tag or commit of the target (default: main)")
    p.set_defaults(func=run)
