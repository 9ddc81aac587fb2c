"""JSON from files the engine did not write itself (or that someone could replace), read with bounds.

Files a person passes on the command line (``tandem models --hardware PROFILE.json``), files
another app keeps (Ollama's manifests) and Tandem's own records that anyone can edit (the model
registry, the header cache) are read through here, so that none of them can:

- block: a FIFO opened for reading waits for a writer forever. The file is opened
  non-blocking and only a regular file is read (checked on the opened file, so nothing can
  swap it between the check and the read);
- read without bound: a link to /dev/zero, or a file of gigabytes, is refused by its size
  before anything is read, and at most ``max_bytes + 1`` bytes are read even if it grows;
- overflow the parser's stack: Python's json recurses once per level, so 100,000 '[' raise
  RecursionError, not ValueError. The nesting is counted first, outside strings.

Every refusal is ``JSONFileError``, a ValueError whose message is one line naming the file and
the reason. The app reads its own files through here too (app.store.json_files).
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

#: Deeper than anything the engine reads (a registry entry nests 5 levels, a hardware profile 3).
MAX_DEPTH = 64
MAX_BYTES = 64 * 2**20
# A whole string (escapes included), or one bracket: group 1 opens, group 2 closes.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|([\[{])|([\]}])', re.DOTALL)


class JSONFileError(ValueError):
    """Not JSON the engine will parse: not a regular file, too big, too deep, or not JSON."""


def read_bytes(path: Path | str, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path``: JSONFileError when it is not a regular file or
    is over ``max_bytes``; OSError when it cannot be opened."""
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    with open(path, "rb", opener=lambda p, _: os.open(p, flags)) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise JSONFileError(f"{path} is not a regular file")
        if info.st_size > max_bytes:
            raise JSONFileError(f"{path} is {info.st_size:,} bytes, more than the {_size(max_bytes)} it may be")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the check
        raise JSONFileError(f"{path} is more than the {_size(max_bytes)} it may be")
    return data


def loads(text: str | bytes, max_depth: int = MAX_DEPTH, where: str = "the JSON") -> object:
    """``json.loads`` that refuses, with JSONFileError, a document nested deeper than
    ``max_depth`` (and says ``where`` in every message)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONFileError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start:,})") from None
    depth = _depth(text, max_depth)
    if depth > max_depth:
        raise JSONFileError(f"{where} nests more than {max_depth} levels deep")
    try:
        return json.loads(text)
    except RecursionError:  # only if max_depth were set beyond what json can recurse
        raise JSONFileError(f"{where} nests too deep to parse") from None
    except ValueError as exc:
        raise JSONFileError(f"{where} is not valid JSON: {exc}") from None


def load(path: Path | str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> object:
    """The JSON value in ``path``, read with ``read_bytes`` and parsed with ``loads``: OSError
    when it cannot be opened, JSONFileError (a ValueError) for every other refusal."""
    return loads(read_bytes(path, max_bytes), max_depth, where=str(path))


def _depth(text: str, limit: int) -> int:
    """How deep ``text``'s brackets outside strings nest, counted up to ``limit + 1``. A text with
    no more brackets than ``limit`` in all cannot nest deeper: most files stop at the count."""
    if text.count("[") + text.count("{") <= limit:
        return 0
    depth = deepest = 0
    for match in _TOKEN.finditer(text):
        if match.lastindex == 1:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif match.lastindex == 2:
            depth -= 1
    return deepest


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n:,} bytes"
