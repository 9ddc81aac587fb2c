"""JSON from files a person can edit, copy in, damage or replace: bounded before it is parsed.

The app's rule for a damaged file is "set it aside, load the rest", and its loaders catch
ValueError and OSError for that. The bounds are the engine's (engine.core.bounded_json, torch-
free): only a regular file is read, opened non-blocking (a FIFO named like a preset once blocked
start-up), its size is checked before it is read (a link to /dev/zero), and the nesting is counted
before json recurses into it (100,000 '[' raise RecursionError, not ValueError). Each refusal is
``JSONFileError``, a ValueError whose message is the reason the log shows.
"""
from __future__ import annotations

from pathlib import Path

from engine.core.bounded_json import MAX_BYTES, MAX_DEPTH, JSONFileError, read_bytes
from engine.core.bounded_json import loads as _bounded_loads

__all__ = ["MAX_BYTES", "MAX_DEPTH", "JSONFileError", "load", "loads", "read_text"]


def loads(text: str, max_depth: int = MAX_DEPTH) -> object:
    """``json.loads`` that refuses, with JSONFileError, a document nested deeper than ``max_depth``."""
    return _bounded_loads(text, max_depth)


def read_text(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``; JSONFileError when it is not a regular file,
    is over ``max_bytes`` or is not UTF-8."""
    data = read_bytes(path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONFileError(f"{Path(path).name} is not UTF-8 text ({exc.reason} at byte {exc.start:,})") from None


def load(path: Path, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> object:
    """The JSON in ``path``, read and parsed with those bounds."""
    return _bounded_loads(read_bytes(path, max_bytes), max_depth, where=Path(path).name)
