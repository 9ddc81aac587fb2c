"""What the `tandem` subcommands share: the default model pair, loading a session, model options."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.core.long_lived import freeze_long_lived
from engine.core.settings import DEFAULT_DRAFT_VOCAB, DEFAULT_MIN_CONFIDENCE, PRECISIONS, precision_name


def _progress_printer():
    last = {}

    def show(stage: str, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if last.get(stage) != pct:
            last[stage] = pct
            print(f"\r  {stage:<9} {pct:3d}%", end="" if pct < 100 else "\n", file=sys.stderr, flush=True)

    return show


def default_model_paths(target: str | None, drafter: str | None, need_drafter: bool = True,
                        full_check: bool = False, precision: str | None = None) -> tuple[Path, Path | None]:
    """The models to load: the given paths, else the default pair for ``precision`` (None: its
    default, default_pair.DEFAULT_PRECISION): its GGUF target for "file", its converted folder
    otherwise, verified (and rebuilt from its GGUF files where damaged; ``full_check`` hashes
    every file, see default_pair.prepare)."""
    from engine.models.loading import default_pair

    if target:
        return Path(target), Path(drafter) if drafter else None
    t, d = default_pair.prepare_pair(precision, need_drafter and not drafter, _progress_printer(), full_check)
    return t, Path(drafter) if drafter else d


def default_precision(target: str | Path | None) -> str:
    """The precision a target loads at when none is asked for: the default pair's default
    (default_pair.DEFAULT_PRECISION); a .gguf file's own quantization; bf16 for a folder."""
    from engine.gguf import is_gguf
    from engine.models.loading import default_pair

    if target is None:
        return default_pair.DEFAULT_PRECISION
    return "file" if is_gguf(target) else "bf16"


def drafter_options(args):
    """The drafter options of a command line, checked (InvalidRequest) before anything loads."""
    from engine.core.settings import DrafterOptions

    return DrafterOptions(head=args.drafter_head, precision=args.drafter_precision, vocab_size=args.draft_vocab_size,
                          min_confidence=args.min_confidence, lookup=not args.no_lookup)


def check_writable(path: Path, what: str = "the report") -> Path:
    """Refuse (InvalidRequest) an output file that cannot be written, by creating and removing
    a file next to it: before a run that takes minutes, not after it."""
    import os
    import tempfile

    from engine.core.settings import InvalidRequest

    path = Path(path)
    if path.is_dir():
        raise InvalidRequest(f"cannot write {what} to {path}: it is a folder")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InvalidRequest(f"cannot write {what} to {path}: the folder {parent} does not exist")
    if path.exists() and not os.access(path, os.W_OK):
        raise InvalidRequest(f"cannot write {what} to {path}: the file is read-only")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".probe")
    except OSError as exc:
        raise InvalidRequest(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)
    return path


def write_json_atomically(path: Path, data) -> None:
    """Replace ``path`` with ``data`` as JSON in one step (temporary file + os.replace): a reader,
    or a run killed mid-write, sees the old file or the new one, never half of one."""
    import json
    import os

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_session(args, need_drafter=True):
    from engine.models.loading.file_precision import label_for
    from engine.session.session import Session

    options = drafter_options(args)
    if args.precision is None:
        args.precision = default_precision(args.target)
    target, drafter = default_model_paths(args.target, args.drafter_model, need_drafter, precision=args.precision)
    print(f"loading {target.name}" + (f" + {drafter.name}" if drafter else "")
          + f" ({args.precision}: {label_for(args.precision, target)})", file=sys.stderr)
    race_with = getattr(args, "race_with", None)
    if race_with:
        from engine.drafters.made_for_target import is_made_for_target_folder

        if drafter is None or not is_made_for_target_folder(drafter):
            raise SystemExit("--race-with races a drafter made for the target: give --drafter-model an EAGLE-3 or DFlash"
                             " folder (one `tandem distill` made, or a published one)")
        print(f"  raced against the draft model {Path(race_with).name}", file=sys.stderr)
    session = Session.load(target, drafter, args.precision, args.device, drafter_options=options,
                           draft_model_path=Path(race_with) if race_with else None)
    if getattr(args, "mlock", False):
        from engine.gguf.resident import CannotKeepResident

        try:
            print(session.keep_weights_resident().describe(), file=sys.stderr)
        except CannotKeepResident as exc:
            print(f"warning: {exc}", file=sys.stderr)
    if getattr(args, "fixed_threads", False):
        from engine.core.threads import ThreadPolicy

        session.threads = ThreadPolicy(adaptive=False)
    freeze_long_lived()  # no GIL-held scans of the loaded models' objects during timed runs or a server's streams
    return session


def default_pair_precisions() -> str:
    """A line for `tandem models`: how the default pair's precisions are named (its GGUF file
    runs by default; the others start from its converted folder)."""
    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair
    from engine.models.loading.file_precision import source_quantization
    from engine.models.planning.precision_labels import FOLDER_PRECISIONS, precision_label

    quant = source_quantization(cache_dir() / "models" / default_pair.TARGET.name)
    quant = quant if quant is not None else ""  # not converted yet: a GGUF file all the same
    default = precision_label(default_pair.DEFAULT_PRECISION, quant)
    others = ", ".join(precision_label(p, quant) for p in FOLDER_PRECISIONS if p != default_pair.DEFAULT_PRECISION)
    return (f"\ndefault-offline precision: {default} (--precision {default_pair.DEFAULT_PRECISION}, the default);"
            f" also {others}")


def human_size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def model_options(p: argparse.ArgumentParser) -> None:
    """The options of every subcommand that loads a target and drafter."""
    p.add_argument("--precision", type=precision_name, choices=PRECISIONS, default=None,
                   help="file: as in the .gguf file (its own quantization, e.g. Q4_K_M, computed from its blocks;"
                        " the default for a .gguf target and for the default pair, which then runs from its GGUF"
                        " file); bf16 (or its older name fast); fp32 (or exact), greedy output token-identical; int8 / int4: the weights"
                        " quantized by Tandem (smaller, faster on a CPU, output different from bf16; int8 layers"
                        " round their inputs to int16, int4 ones to int8 as llama.cpp's Q4 formats do). For a model"
                        " converted from a GGUF file (the default pair's folder) bf16 and fp32 hold the file's"
                        " values dequantized and int8 / int4 re-quantize them (a second rounding). Speculation on a"
                        " quantized target stays token-identical to plain decoding of the same target (default:"
                        " file for the default pair and a .gguf target, fast for a folder)")
    p.add_argument("--target", help="model folder or .gguf file (default: the offline Qwen2.5-Coder 1.5B)")
    p.add_argument("--drafter-model", help="draft model folder or .gguf file, or a Gemma 4 -assistant folder for a Gemma 4"
                                           " target (default: Qwen2.5-Coder 0.5B)")
    p.add_argument("--drafter", choices=["model", "lookup", "mtp"], default="model",
                   help="model: --drafter-model (a draft model or Gemma 4 assistant); lookup: prompt lookup;"
                        " mtp: the target's own MTP layers (prompt lookup when it has none)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--drafter-head", choices=["pruned", "full"], default="pruned",
                   help="draft from a reduced LM head (frequent tokens + the request's own) or the full vocabulary")
    p.add_argument("--drafter-precision", choices=["auto", "int8", "int4", "bf16", "fp32"], default="auto",
                   help="drafter weights; auto: int8 where the fast CPU kernel runs, int4 next to an int8 / int4 "
                        "target or a GGUF file (never changes the output)")
    p.add_argument("--draft-vocab-size", type=int, default=DEFAULT_DRAFT_VOCAB,
                   help="tokens kept by the pruned drafter head")
    p.add_argument("--min-confidence", type=float, default=DEFAULT_MIN_CONFIDENCE,
                   help="stop a draft once the drafter's probability of its next token is below this")
    p.add_argument("--mlock", action="store_true",
                   help="keep a GGUF target's weights locked in RAM, so that other programs' memory use cannot push them"
                        " out to be read from disk again at every step; where the locked-memory limit (ulimit -l) does not"
                        " cover the file, the weights are copied into this process's memory instead, and where there is"
                        " not the free memory for that, a warning and the run goes on memory-mapped)")
    p.add_argument("--fixed-threads", action="store_true",
                   help="keep torch's thread count for every step (default: give up threads to cores that other"
                        " programs keep busy, which runs several times faster beside them)")
    p.add_argument("--no-lookup", action="store_true",
                   help="draft with the model alone (default: prompt lookup drafts where the text copies the prompt)")
