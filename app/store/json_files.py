"""JSON from files a person can edit, copy in, damage or replace: bounded before it is parsed.

The app's rule for a damaged file is "set it aside, load the rest", and its loaders catch
ValueError and OSError for that. Three kinds of file got past them:
- Deep nesting: Python's json recurses once per level, so 100,000 '[' raise RecursionError, not
  a ValueError, and start-up stopped. Depth is checked first, by a scan of the brackets outside
  strings (one regular expression: ~0.7 s for a 61 MiB file dense with brackets, nothing for a
  file with fewer brackets than the limit).
- Size: a file the app writes is never near ``MAX_BYTES``; a bigger one is refused before it is
  read, not read whole into memory.
- Not a file: a FIFO named like a preset blocked start-up forever, a link to /dev/zero read until
  memory ran out. Only a regular file is read (checked on the opened file, so nothing can swap it).
Each is refused with ``JSONFileError``, a ValueError whose message is the reason the log shows.
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

#: Deeper than anything the app writes (a conversation nests 4 levels, an export 6), with room
#: for fields a newer version adds; far below where json's recursion gives out (~1,000).
MAX_DEPTH = 64
MAX_BYTES = 64 * 2**20
# A whole string (escapes included), or one bracket: group 1 opens, group 2 closes.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|([\[{])|([\]}])', re.DOTALL)


class JSONFileError(ValueError):
    """The file is not JSON the app will parse: too deep, too big, or not a regular file."""


def loads(text: str, max_depth: int = MAX_DEPTH) -> object:
    """``json.loads`` that refuses, with JSONFileError, a document nested deeper than ``max_depth``."""
    depth = _depth(text, max_depth)
    if depth > max_depth:
        raise JSONFileError(f"the JSON nests more than {max_depth} levels deep")
    try:
        return json.loads(text)
    except RecursionError:  # only if max_depth were set beyond what json can recurse
        raise JSONFileError(f"the JSON nests too deep to parse ({depth} levels)") from None


def read_text(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``; JSONFileError when it is not a regular file
    or is over ``max_bytes``. Opened non-blocking: a FIFO then opens at once (and is refused)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    with open(path, "rb", opener=lambda p, _: os.open(p, flags)) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise JSONFileError(f"{Path(path).name} is not a regular file")
        if info.st_size > max_bytes:
            raise JSONFileError(f"{Path(path).name} is larger than the {_mib(max_bytes)} a file may be ({info.st_size:,} bytes)")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the check
        raise JSONFileError(f"{Path(path).name} is larger than the {_mib(max_bytes)} a file may be")
    return data.decode("utf-8")


def load(path: Path, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> object:
    """The JSON in ``path``, read with ``read_text`` and parsed with ``loads``."""
    return loads(read_text(path, max_bytes), max_depth)


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


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"
