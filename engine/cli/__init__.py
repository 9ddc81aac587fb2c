"""`tandem` command line: set up the default models, compare, benchmark, download, list models.

One module per subcommand (or pair of close ones); each adds its parser here.
"""
from __future__ import annotations

import argparse
import logging
import sys

from engine.cli import bench, distill, download, fidelity, generate, models, remote, serve
from engine.cli import import_model
from engine.core.settings import InvalidRequest
from engine.remote.text import printable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description="Lossless speculative decoding for local models")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    generate.add_parsers(sub)
    bench.add_parser(sub)
    fidelity.add_parser(sub)
    distill.add_parser(sub)
    download.add_parser(sub)
    models.add_parser(sub)
    import_model.add_parser(sub)
    serve.add_parser(sub)
    remote.add_remote_options(sub)  # --remote URL on compare and models
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except InvalidRequest as exc:  # a usage error, found before anything was loaded: status 2, as argparse's
        print(f"tandem: error: {describe(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a readable message, not a traceback, for expected failures
        if args.verbose:
            raise
        print(f"tandem: error: {describe(exc)}", file=sys.stderr)
        return 1


def describe(exc: BaseException) -> str:
    """An error's message for the terminal: never empty (a MemoryError has no text), and with
    any control sequences it carries (a server's or a file's text) shown as escapes."""
    text = str(exc).strip()
    if isinstance(exc, MemoryError):
        text = f"out of memory (MemoryError){': ' + text if text else ''}"
    return printable(text or type(exc).__name__)
