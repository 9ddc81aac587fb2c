"""`tandem models`: the catalog with memory fit and a recommendation for this (or a described) machine."""
from __future__ import annotations

import json


def run(args) -> int:
    from dataclasses import replace

    from engine.core.settings import InvalidRequest
    from engine.models.loading.machine import detect_machine
    from engine.models.planning.catalog import load_catalog
    from engine.models.planning.fit import assess, recommend
    from engine.models.planning.hardware import Hardware
    from engine.models.planning.memory_fit import human_bytes

    if args.context is not None and args.context < 1:
        raise InvalidRequest(f"--context must be at least 1 token, not {args.context}")
    hardware = Hardware.from_profile_file(args.hardware) if args.hardware else detect_machine()
    # A model cannot run past its context window, whatever memory it fits: ranked apart, never
    # recommended, with the reason.
    entries = load_catalog()
    too_long = [e for e in entries if args.context and e.max_context and args.context > e.max_context]
    usable = [e for e in entries if e not in too_long]
    # No --precision: the picker's choice, as the app makes it (16-bit, 4-bit on a GPU or a Mac, or
    # one of the model's GGUF files); "file": the GGUF files only.
    precisions = (args.precision,) if args.precision else None
    results = recommend(usable, hardware, args.context, precisions=precisions) if usable else []
    for entry in too_long:
        at_window = assess(entry, hardware, "bf16" if args.precision in (None, "file") else args.precision,
                           entry.max_context)
        results.append(replace(at_window, context=args.context, fit="none", recommended=False,
                               reason=f"its context window is {entry.max_context} tokens, below the {args.context} asked"))
    local = [] if args.no_local or args.precision not in (None, "file") else _local_rows(hardware, args.context)
    if args.json:
        # Each row says what runs ("variant": a GGUF quant or "safetensors"), its "file_bytes" and
        # its "source" ("hub" for the catalog; a local file names the app it came from, or
        # "imported", with its path and how it is drafted for). A local file Tandem cannot run
        # (damaged, missing, unsupported) is a row too: "problem" says why, "fit" is "none".
        rows = [r.to_dict() for r in results] + [_local_dict(row) for row in local]
        print(json.dumps({"hardware": hardware.to_dict(), "models": rows}, indent=1))
        return 0
    gpus = ", ".join(f"{g.name} {human_bytes(g.free_bytes)} free" for g in hardware.gpus) or "no CUDA GPU"
    unified = f", unified memory {human_bytes(hardware.unified_memory)}" if hardware.unified_memory else ""
    print(f"{hardware.cpu_model}: RAM {human_bytes(hardware.ram_available)} free of {human_bytes(hardware.ram_total)}"
          f"{unified}; {gpus}" + (f"; disk {human_bytes(hardware.disk_free)} free" if hardware.disk_free is not None else ""))
    print(f"\n   {'model':<21}{'drafter':<13}{'variant':<13}{'file':>9}{'context':>8}{'needs':>10}  {'fit':<8}"
          f"{'speedup':<11}reason")
    for r in results:
        speedup = f"{r.predicted_speedup[0]:.1f}-{r.predicted_speedup[1]:.1f}x"
        variant = r.variant if r.gguf else r.precision
        size = human_bytes(r.file_bytes) if r.file_bytes else "?"
        print(f"{'*' if r.recommended else ' '}  {r.entry.id:<21}{r.entry.drafter_kind:<13}{variant:<13}{size:>9}{r.context:>8}"
              f"{human_bytes(r.estimate.total):>10}  {r.fit:<8}{speedup:<11}{r.reason}")
    if local:
        print("\n   GGUF files on this machine (LM Studio, llama.cpp, Ollama, tandem import):")
        for row in local:
            name = row.model.name if len(row.model.name) <= 40 else row.model.name[:39] + "…"
            if row.problem is not None:  # marked "!": listed, never weighed or recommended
                variant = row.model.quant or "?"
                print(f" ! {name:<41}{variant:<9}{human_bytes(row.model.file_bytes or 0):>9}{'':>10}  {'none':<8}"
                      f"{row.model.source:<10}problem: {_one_line(row.problem)}")
                continue
            r, drafting = row.fit, row.model.drafting
            drafter = drafting.drafter.name if drafting.drafter is not None else f"prompt lookup ({drafting.reason})"
            print(f"   {name:<41}{r.variant:<9}{human_bytes(r.file_bytes or 0):>9}{human_bytes(r.estimate.total):>10}"
                  f"  {r.fit:<8}{r.source:<10}drafter: {drafter}")
    if any(r.entry.id == "default-offline" for r in results):
        from engine.cli.common import default_pair_precisions

        print(default_pair_precisions())
    best = next((r for r in results if r.recommended), None)
    if best:
        what = f"{best.gguf.repo} {best.variant} ({human_bytes(best.gguf.file_bytes)})" if best.gguf else best.precision
        print(f"\nrecommended: {best.entry.name} with {best.entry.drafter_repo or best.entry.drafter_kind}, "
              f"{what} on {best.device}, context {best.context}")
    else:
        print("\nnothing in the catalog fits this machine")
    return 0


class _Row:
    """A local model's row: ``fit`` and ``model`` (a LocalFit's), or ``problem`` where the model
    cannot be weighed (damaged, missing, an architecture Tandem lacks: listed, marked)."""

    def __init__(self, row) -> None:
        self.model = row.model
        self.fit = getattr(row, "fit", None)
        self.problem = getattr(row, "problem", None)


def _local_rows(hardware, context) -> list[_Row]:
    """The GGUF files found on this machine, weighed like catalog rows (engine.library); the
    ones that cannot be weighed are rows too, with their problem."""
    from engine.library import list_local_models
    from engine.library.fit_rows import local_rows

    return [_Row(r) for r in local_rows(list_local_models(), hardware, context)]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _local_dict(row: _Row) -> dict:
    if row.problem is not None:
        from engine.library.fit_rows import local_id

        m = row.model
        return {"id": local_id(m), "name": m.name, "family": m.architecture, "target_repo": m.name, "drafter_repo": None,
                "drafter_kind": None, "precision": "file", "context": None, "estimate_bytes": None, "fit": "none",
                "reason": _one_line(row.problem), "recommended": False, "predicted_speedup": None,
                "source": m.source, "variant": m.quant, "file_bytes": m.file_bytes, "path": str(m.path),
                "problem": _one_line(row.problem), "drafter": None, "drafter_path": None, "drafting_reason": None,
                "refused_drafters": []}
    drafting = row.model.drafting
    return {**row.fit.to_dict(), "path": str(row.model.path), "problem": None,
            "drafter": drafting.drafter.name if drafting.drafter is not None else None,
            "drafter_path": str(drafting.drafter.path) if drafting.drafter is not None else None,
            "drafting_reason": drafting.reason,
            "refused_drafters": [{"name": r.candidate.name, "why": r.why, "message": r.message} for r in drafting.refusals]}


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="the model catalog with memory fit and a recommendation for this machine")
    p.add_argument("--context", type=int, default=None, help="context length in tokens (default: the longest that fits)")
    p.add_argument("--precision", default=None,
                   help="bf16 (fast), fp32 (exact), fp16, int8, int4, or file (the models' GGUF files); default: the "
                        "picker's choice among 16-bit, 4-bit on a GPU or a Mac, and the GGUF files")
    p.add_argument("--hardware", metavar="PROFILE.json",
                   help="plan for a described machine: JSON with ram_gb, gpus [{name, vram_gb}], unified_memory_gb, disk_free_gb")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-local", action="store_true",
                   help="leave out the GGUF files found on this machine (LM Studio, llama.cpp, Ollama, imported)")
    p.set_defaults(func=run)
