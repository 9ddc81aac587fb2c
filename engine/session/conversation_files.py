"""The files of a conversation folder, read as the app's store reads them.

Two readers walk the same folder: the app's store (app/store/conversations.py), which sets a
refused file aside and loads the rest, and `tandem distill --conversations`, which skips it. They
read through this one walk so that both take, and refuse, the same files.

A folder can hold anything, so each file is checked before it is used: a name starting with "."
is a save in progress (or not the store's) and is passed over; a link, a folder or a device is
refused (the store writes regular files only); the name must be a conversation id; the JSON is
bounded before it is parsed (engine.core.bounded_json) and validated in full
(engine.session.conversation_schema).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.core import bounded_json
from engine.session.conversation_schema import SchemaError, validate

#: Letters, digits, '-' and '_', starting with a letter or digit: no separators, no dots, nothing
#: a shell or a file system reads specially. uuid4().hex[:12] ids (the app's default) match.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# Device names Windows refuses as file names (with any extension).
_RESERVED = {"con", "prn", "aux", "nul"} | {f"{p}{d}" for p in ("com", "lpt") for d in range(1, 10)}


def is_valid_id(conversation_id: object) -> bool:
    """Whether ``conversation_id`` is safe as a file name in the store (it is the file's stem)."""
    return (isinstance(conversation_id, str) and ID_PATTERN.fullmatch(conversation_id) is not None
            and conversation_id.lower() not in _RESERVED)


class NotARegularFile(ValueError):
    """A link, folder or device named like a conversation: never a file the store wrote."""


@dataclass(frozen=True)
class ConversationFile:
    """One ``*.json`` file of the folder: its validated contents, or why it was refused."""

    path: Path
    raw: dict | None = None
    #: None when ``raw`` is set. NotARegularFile; FileNotFoundError (deleted meanwhile, by
    #: another instance); otherwise a damaged or foreign file (OSError or ValueError: SchemaError,
    #: JSONFileError and UTF-8 errors are ValueErrors).
    error: Exception | None = None


def read_conversation_file(path: Path) -> ConversationFile:
    """``path`` checked, bounded, parsed and validated; an error is returned, never raised."""
    path = Path(path)
    try:
        if path.is_symlink() or not path.is_file():
            raise NotARegularFile(f"{path.name} is not a regular file")
        if not is_valid_id(path.stem):
            raise SchemaError(f"the file name is not a conversation id (letters, digits, '-', '_'): {path.name!r}")
        return ConversationFile(path, raw=validate(bounded_json.load(path)))
    except (OSError, ValueError) as exc:
        return ConversationFile(path, error=exc)


def read_conversation_files(folder: Path) -> Iterator[ConversationFile]:
    """Every conversation file of ``folder`` by name, hidden ones and temporaries passed over."""
    for path in sorted(Path(folder).glob("*.json")):
        if not path.name.startswith("."):
            yield read_conversation_file(path)
