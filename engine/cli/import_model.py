"""`tandem import PATH`: register a GGUF file where it lies (nothing is copied), and say what
drafts for it. A file Tandem cannot use is refused with one line and exit status 2."""
from __future__ import annotations

import sys

from engine.cli.common import human_size


def run(args) -> int:
    from engine.gguf.reader import GgufError
    from engine.library import find_local_model, forget, import_model, list_local_models

    if args.forget:
        if forget(args.path):
            print(f"forgot {args.path} (the file is left where it is)")
            return 0
        print(f"tandem: error: {args.path} is not registered", file=sys.stderr)
        return 2
    try:
        model = import_model(args.path)
    except (GgufError, OSError) as exc:
        print(f"tandem: error: {exc}", file=sys.stderr)
        return 2
    listed = find_local_model(model.path, list_local_models()) or model
    parts = f" in {len(model.parts)} parts" if len(model.parts) > 1 else ""
    params = f", {_count(model.parameter_count)} parameters" if model.parameter_count else ""
    print(f"registered {model.name}: {model.architecture}, {model.quant}, {human_size(model.file_bytes)}{parts}{params}")
    print(f"  path: {model.path}")
    drafting = listed.drafting
    if drafting is None:
        pass
    elif drafting.kind == "model":
        print(f"  drafter: {drafting.drafter.name} ({drafting.drafter.source}; {drafting.reason})")
    else:
        print(f"  drafter: prompt lookup ({drafting.reason})")
    return 0


def _count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'B' else 0}f}{unit}"
    return str(n)


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="register a GGUF file you already have (it stays where it is)")
    p.add_argument("path", help="a .gguf file, or any part of a split model")
    p.add_argument("--forget", action="store_true", help="unregister the file instead (it is not deleted)")
    p.set_defaults(func=run)
