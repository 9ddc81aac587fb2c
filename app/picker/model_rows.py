"""What each picker row says: variant, file size, memory fit, expected speed, source, drafter.

One row per model: the catalog's (``engine.models.planning.fit.FitResult``, its recommended variant) and
the local GGUF files (``engine.library.fit_rows.LocalFit``: a FitResult plus the library's
drafting: the drafter, or prompt lookup and the candidates refused, with why). The other
variants of a catalog model are offered in the detail area (``variant_fits``).

No torch and no Qt here: plain text for the view to put into cells (engine.models.planning.fit and
memory_fit are torch-free; the GUI thread may call them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from engine.models.planning.memory_fit import human_bytes

COLUMNS = ["Model", "Params", "Variant", "Size", "Memory", "Fit", "Speed (plain)", "Source", "Drafter", "Speedup",
           "Installed"]
VARIANT, SIZE, MEMORY, FIT, SPEED, SOURCE, DRAFTER = 2, 3, 4, 5, 6, 7, 8
SOURCE_LABELS = {"hub": "Hub", "pypi": "bundled", "local": "this machine", "lmstudio": "LM Studio",
                 "ollama": "Ollama", "llama.cpp": "llama.cpp", "imported": "imported"}
LOCAL_SOURCES = ("lmstudio", "ollama", "llama.cpp", "imported", "local")
KIND_LABELS = {
    "draft_model": "small draft model",
    "assistant": "MTP assistant (shares KV)",
    "mtp": "MTP heads in checkpoint",
    "lookup": "prompt lookup",
    "eagle3": "EAGLE-3, made for this model (reads its hidden states)",
    "dflash": "DFlash, made for this model (drafts a block in one pass)",
}
MADE_FOR_TARGET_NAMES = {"eagle3": "EAGLE-3", "dflash": "DFlash"}
FIT_LABELS = {
    "gpu": ("Fits on GPU", "#188038"),
    "unified": ("Fits in unified memory", "#188038"),
    "cpu": ("Fits in RAM (CPU)", "#1a73e8"),
    "tight": ("Tight", "#b06000"),
    "none": ("Does not fit", "#d93025"),
}
SAFETENSORS = "safetensors"  # engine.models.planning.variants.SAFETENSORS, without importing it here
# What a refusal was about, as the picker names it (engine.library's DrafterRefusal.why).
REFUSAL_WORDS = {"vocabulary": "vocabulary", "larger": "size", "architecture": "architecture"}


@dataclass(frozen=True)
class Cell:
    text: str
    tip: str = ""
    color: str | None = None


def human_params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def speedup_text(value) -> str:
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return f"{value[0]:.1f}–{value[1]:.1f}×"
    return f"{value:.1f}×" if value else "–"


def is_local(fit) -> bool:
    return getattr(fit, "source", "hub") in LOCAL_SOURCES


def source_label(fit) -> str:
    source = getattr(fit, "source", None) or fit.entry.source
    return SOURCE_LABELS.get(source, source)


def variant_label(fit) -> str:
    """The GGUF quant that runs ("Q4_K_M"), or "bf16 · safetensors" (the precision the
    safetensors load at)."""
    variant = getattr(fit, "variant", SAFETENSORS)
    return f"{fit.precision} · {SAFETENSORS}" if variant == SAFETENSORS else variant


def size_text(fit) -> tuple[str, str]:
    """(cell, tooltip): the bytes to download or read for this variant."""
    size = getattr(fit, "file_bytes", None)
    gguf = getattr(fit, "gguf", None)
    if not size:
        return "–", "size unknown"
    if gguf is not None:
        how = {"hub": "the Hub's exact size", "computed": "computed from the architecture (the download checks the Hub's)",
               "file": "measured on the file here"}.get(gguf.size_source, gguf.size_source)
        where = f"{gguf.repo}: " if gguf.repo else ""
        files = ", ".join(gguf.files)
        return human_bytes(size), f"{where}{files}\n{size:,} bytes, {how}"
    return human_bytes(size), f"{size:,} bytes of safetensors weights (as the Hub stores them)"


def memory_cell(fit) -> Cell:
    est = fit.estimate
    breakdown = (f"file / weights {human_bytes(est.weights)} + KV cache {human_bytes(est.kv_cache)} + drafter "
                 f"{human_bytes(est.drafter)} + runtime {human_bytes(est.overhead)} at {fit.context:,} tokens")
    return Cell(human_bytes(est.total), breakdown)


def drafting_of(local):
    """The library's Drafting of a local row (None for a catalog row)."""
    model = getattr(local, "model", None)
    return getattr(model, "drafting", None)


def refusal_lines(drafting) -> list[str]:
    """One line per refused candidate, "size: drafter larger than target: X has ...": what it
    was about (vocabulary, size, architecture), then the library's reason, which names it."""
    return [f"{REFUSAL_WORDS.get(r.why, r.why)}: {r.message}" for r in drafting.refusals]


def trained_drafter_beside(targets: list[Path]) -> Path | None:
    """The drafter trained on this machine (Model > Train a drafter…, or ``tandem distill``) for
    the model whose files are ``targets`` (it sits beside them); None where there is none."""
    from app.bridge.distill_jobs import default_drafter_folder

    for target in targets:
        folder = default_drafter_folder(target)
        if (folder / "config.json").is_file():
            return folder
    return None


def drafter_cell(fit, local=None, trained: Path | None = None) -> Cell:
    """The drafter, or "prompt lookup" with why no model drafts (the tooltip lists each
    candidate turned down and the reason); ``trained``: a drafter trained here for the model,
    named after it."""
    cell = _drafter_cell(fit, local)
    if trained is None:
        return cell
    return Cell(f"{cell.text} + trained here", f"{cell.tip}\nA drafter trained on this machine: {trained}. The "
                "model's Drafter setting \"Trained here\" loads it, and the demo races it against the draft model.",
                cell.color)


def _drafter_cell(fit, local=None) -> Cell:
    drafting = drafting_of(local)
    if drafting is not None:
        if drafting.kind == "model" and drafting.drafter is not None:
            d = drafting.drafter
            tip = f"{d.name} ({SOURCE_LABELS.get(d.source, d.source)}, {human_bytes(d.file_bytes)}): {drafting.reason}"
            if drafting.refusals:
                tip += "\nAlso considered:\n" + "\n".join(refusal_lines(drafting))
            return Cell(short_name(d.name.rsplit("/", 1)[-1]), tip)
        tip = f"Prompt lookup drafts: {drafting.reason}"
        if drafting.refusals:
            tip += "\nCandidates refused:\n" + "\n".join(refusal_lines(drafting))
        return Cell(f"prompt lookup ({_short_reason(drafting)})", tip, "#b06000")
    e = fit.entry
    if not e.drafter_repo:
        return Cell("prompt lookup", "n-gram lookup in the prompt and reply; no extra model")
    drafter_gguf = getattr(fit, "drafter_gguf", None)
    name = short_name(e.drafter_repo.split("/")[-1]) + (f" {drafter_gguf.quant}" if drafter_gguf is not None else "")
    if e.drafter_kind in MADE_FOR_TARGET_NAMES:  # the kind first: it says why this pair drafts well
        name = f"{MADE_FOR_TARGET_NAMES[e.drafter_kind]}: {name}"
    tip = f"{e.drafter_repo} · {KIND_LABELS.get(e.drafter_kind, e.drafter_kind)}"
    if drafter_gguf is not None:
        tip += f"\nGGUF {drafter_gguf.quant}: {drafter_gguf.repo}/{drafter_gguf.files[0]} ({human_bytes(drafter_gguf.file_bytes)})"
    return Cell(name, tip)


def short_name(name: str) -> str:
    """A model name without its "-Instruct" / "-it" tag, for a narrow cell (tooltips keep it)."""
    return re.sub(r"-(instruct|it)(?=-|$)", "", name, flags=re.IGNORECASE)


def _short_reason(drafting) -> str:
    """A few words for the cell: the kind of the first refusal, else "none installed"."""
    if not drafting.refusals:
        return "no drafter installed"
    first = next((r for r in drafting.refusals if r.why in ("larger", "architecture")), drafting.refusals[0])
    return {"vocabulary": "vocabulary differs", "larger": "drafter not smaller",
            "architecture": "architecture"}.get(first.why, first.why)


def detail_text(fit, local=None) -> str:
    """The line under the table for the selected row: fit, and the drafter or why none."""
    text = f"{fit.entry.name} ({variant_label(fit)}, {source_label(fit)}): {fit.reason.split('; ')[0]}"
    drafting = drafting_of(local)
    if drafting is not None and drafting.kind == "lookup":
        text += f"\nDrafting by prompt lookup: {drafting.reason}"
        for line in refusal_lines(drafting):
            text += f"\n  · refused, {line}"
    elif drafting is not None and drafting.drafter is not None:
        text += f"\nDrafter: {drafting.reason}"
        for line in refusal_lines(drafting):
            text += f"\n  · passed over, {line}"
    if local is not None:
        text += f"\nFile: {local.model.path}"
    return text


def variant_fits(fit, hardware, context: int | None = None) -> list:
    """Every way to run ``fit``'s catalog model here: each GGUF variant (precision "file") and
    its safetensors at the precision ``fit`` names (bf16 when ``fit`` is a file), assessed at
    ``context`` (default ``fit``'s); ``fit``'s own variant comes back as ``fit`` itself. A local
    row has one variant: its file."""
    if hardware is None or is_local(fit):
        return [fit]
    from engine.models.planning.fit import assess

    context = context or fit.context
    out = []
    for v in fit.entry.variants:
        if v.quant == getattr(fit, "variant", None):
            out.append(fit)
        else:
            out.append(replace(assess(fit.entry, hardware, "file", context, variant=v), recommended=False))
    if getattr(fit, "variant", SAFETENSORS) == SAFETENSORS:
        out.append(fit)
    else:
        out.append(replace(assess(fit.entry, hardware, "bf16", context), recommended=False))
    return out


def speed_hint(hardware, fit):
    """engine.models.planning.decode_speed.SpeedHint (plain tokens/sec expected) for a CPU fit, else None."""
    if hardware is None or fit.device != "cpu" or fit.fit == "none":
        return None
    from engine.models.planning.decode_speed import predict_plain_rate

    return predict_plain_rate(hardware, fit.estimate.weights, fit.precision)


def variant_choice_label(fit, speed: str = "") -> str:
    """A variant combo's item: "Q5_K_M · 1.1 GB file · needs 1.6 GB · Fits in RAM (CPU) · ≈9 tok/s"
    (``speed``: the Speed column's text for it)."""
    size = f" · {human_bytes(fit.file_bytes)} file" if getattr(fit, "file_bytes", None) else ""
    star = "  ★ recommended" if fit.recommended else ""
    speed = f" · {speed}" if speed else ""
    return (f"{variant_label(fit)}{size} · needs {human_bytes(fit.estimate.total)} · "
            f"{FIT_LABELS.get(fit.fit, (fit.fit,))[0]}{speed}{star}")


def installed_for(fit, installed_ids: frozenset[str]) -> bool:
    """Whether what this row runs is on disk (see ``target_files``)."""
    return target_files(fit, installed_ids) is not None


def target_files(fit, installed_ids: frozenset[str], local=None) -> list[Path] | None:
    """None where what this row runs is not on disk; else its target's files or folders (empty
    where not known): a local file always (``local``: its discovered model); the bundled pair
    when installed with the app's packages (its GGUF file, or its converted folder); a GGUF
    variant when its download is verified; safetensors when the repo's own weights are (the
    probe's ids). Each install marker is read once."""
    if is_local(fit):
        return [Path(local.model.path)] if local is not None else []
    if fit.entry.source == "pypi":
        if fit.entry.id not in installed_ids:
            return None
        from engine.models.loading import default_pair

        return list(default_pair.target_paths())
    variant = getattr(fit, "gguf", None)
    if variant is None and fit.entry.id not in installed_ids:
        return None
    from app.picker.downloads import installed_paths

    try:
        paths = installed_paths(fit.entry, variant)
    except (OSError, ValueError):  # an unreadable marker is "not installed", never a broken picker
        return None if variant is not None else []
    if paths is None:
        return None if variant is not None else []
    return [Path(paths[0])]


def hardware_text(hw) -> str:
    """One line: RAM, CPU, GPUs or Apple memory, free disk (engine.models.planning.hardware.Hardware)."""
    if hw is None:
        return "Hardware: unknown"
    parts = [f"RAM {human_bytes(hw.ram_total)} ({human_bytes(hw.ram_available)} free)"]
    if hw.cpu_cores:  # a described machine (profile) may not say
        parts.append(f"CPU {hw.cpu_model} · {hw.cpu_cores} cores")
    for gpu in hw.gpus:
        parts.append(f"GPU {gpu.name} {human_bytes(gpu.total_bytes)} ({human_bytes(gpu.free_bytes)} free)")
    if hw.unified_memory:
        parts.append(f"Apple unified memory {human_bytes(hw.unified_memory)}")
    if not hw.gpus and not hw.unified_memory:
        parts.append("no GPU: models run on the CPU")
    if hw.disk_free is not None:
        parts.append(f"{human_bytes(hw.disk_free)} free disk")
    return " · ".join(parts)
