"""Chat history on disk: one JSON file per conversation under the user data dir.

Nothing on disk can cost the user their chats:
- Writes are atomic (temp file, fsync, rename), so a crash or a kill mid-save leaves either the
  old file or the new one, never a torn one. Temporaries a kill left behind are removed at the next
  start once stale (by name and age: a second instance's save in progress is never touched).
- A conversation's id is its file name, checked against a fixed safe pattern; an id inside a file
  never becomes a path, and every path the store touches must resolve inside its directory.
- Every file is checked and validated in full on load (engine/session/conversation_files.py, the
  walk `tandem distill --conversations` reads the same folder with). One that fails is set aside
  under a unique *.unreadable name, never deleted, with the reason in the log; the rest load. So is
  one nested too deep or too big to parse safely (engine/core/bounded_json.py).
"""
from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from engine.session.conversation_files import (
    ConversationFile,
    NotARegularFile,
    is_valid_id,
    read_conversation_file,
    read_conversation_files,
)
from engine.session.conversation_schema import validate
from engine.session.saved_turns import model_turn

log = logging.getLogger(__name__)

TEMP_PREFIX, TEMP_SUFFIX = ".tmp-", ".json"
TEMP_PATTERN = re.compile(r"\.tmp-[A-Za-z0-9_]+\.json")  # what tempfile.mkstemp makes for save()
#: A temporary older than this is a killed save's leftover: a live save renames its own in well
#: under a second, so minutes leave a wide margin for a slow disk and a second instance.
STALE_TEMPORARY_S = 300.0
BACKUP_SUFFIX = ".unreadable"


class InvalidConversationId(ValueError):
    """An id that is not safe to use as a file name in the store."""


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    #: {"role", "content", optional "stats", "meta", and for a user turn "attachments": a list of
    #: app.store.attachments.Attachment.to_json(); a reply that called tools has "tool_calls" ({"name",
    #: "arguments"}), each followed by a "tool" turn with the tool's "name", its result as
    #: "content" and "outcome" (ran, failed, declined)}
    messages: list[dict] = field(default_factory=list)
    #: Sent as the chat template's system message before the turns (none when empty).
    system_prompt: str = ""
    #: Top-level fields this version does not know (written by a newer Tandem): kept as they were
    #: and written back on save, so opening a chat in an older version never drops them.
    extra: dict = field(default_factory=dict, repr=False, compare=False)

    def chat_messages(self) -> list[dict]:
        """What the model sees: the system prompt, then roles and contents only, each user turn's
        attached files written into its content, a reply's tool calls and each tool's result as the
        chat template writes them (engine.session.saved_turns)."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        return system + [model_turn(m) for m in self.messages]

    def to_json(self) -> dict:
        data = asdict(self)
        return {**data.pop("extra"), **data}


_FIELDS = tuple(f.name for f in fields(Conversation) if f.name != "extra")


@dataclass(frozen=True)
class SetAside:
    """A conversation file that could not be loaded, and where it went."""

    original: Path
    backup: Path | None  # None: it could not be renamed either, so it was left where it was
    reason: str


class ConversationStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        #: The files the last load_all() set aside (for the window's notice).
        self.set_aside: tuple[SetAside, ...] = ()

    def path(self, conversation_id: str) -> Path:
        if not is_valid_id(conversation_id):
            raise InvalidConversationId(f"not a safe conversation id: {conversation_id!r}")
        candidate = self.directory / f"{conversation_id}.json"
        # Defence in depth: whatever the pattern allows, the file itself (a link followed) must lie
        # directly in the store.
        if candidate.resolve().parent != self.directory.resolve():
            raise InvalidConversationId(f"conversation {conversation_id!r} resolves outside {self.directory}")
        return candidate

    def save(self, conversation: Conversation) -> None:
        target = self.path(conversation.id)
        conversation.updated = time.time()
        raw = conversation.to_json()
        validate(raw)  # never write what the next start would have to set aside
        data = json.dumps(raw, ensure_ascii=False, indent=1, allow_nan=False)
        _write_atomically(self.directory, target, data.encode("utf-8"))

    def load_all(self) -> list[Conversation]:
        """Newest first. Files that fail validation are set aside (see ``set_aside``) and skipped."""
        self.remove_stale_temporaries()
        out, set_aside = [], []
        for found in read_conversation_files(self.directory):
            if isinstance(found.error, NotARegularFile):
                log.warning("not loading %s: not a regular file", found.path.name)
            elif isinstance(found.error, FileNotFoundError):
                continue  # another instance deleted it meanwhile
            elif found.error is not None:
                set_aside.append(self._set_aside(found.path, str(found.error)))
            else:
                out.append(self._conversation(found))
        self.set_aside = tuple(set_aside)
        return sorted(out, key=lambda c: c.updated, reverse=True)

    def delete(self, conversation_id: str) -> bytes | None:
        """Remove the file; returns its bytes (None if there was none) so it can be put back."""
        path = self.path(conversation_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        path.unlink(missing_ok=True)
        return data

    def restore(self, conversation_id: str, data: bytes) -> Conversation:
        """Put a deleted file back byte for byte (undo), atomically; returns it loaded."""
        target = self.path(conversation_id)
        _write_atomically(self.directory, target, data)
        return self._load(target)

    def remove_stale_temporaries(self, max_age_s: float = STALE_TEMPORARY_S) -> list[Path]:
        """Remove the temporaries killed saves left behind; returns the paths removed."""
        removed, now = [], time.time()
        for path in self.directory.glob(f"{TEMP_PREFIX}*{TEMP_SUFFIX}"):
            try:
                stat = path.lstat()
                if TEMP_PATTERN.fullmatch(path.name) and path.is_file() and now - stat.st_mtime > max_age_s:
                    path.unlink()
                    removed.append(path)
            except FileNotFoundError:
                continue  # its save finished (renamed) or another instance removed it
            except OSError as exc:
                log.warning("could not remove the stale temporary %s: %s", path.name, exc)
        if removed:
            log.info("removed %d stale temporary file(s) of interrupted saves in %s", len(removed), self.directory)
        return removed

    # --- internals ----------------------------------------------------------------------------
    def _load(self, path: Path) -> Conversation:
        found = read_conversation_file(path)
        if found.error is not None:
            raise found.error
        return self._conversation(found)

    @staticmethod
    def _conversation(found: ConversationFile) -> Conversation:
        conversation_id, raw = found.path.stem, found.raw
        claimed = raw.get("id", conversation_id)
        if claimed != conversation_id:
            log.warning("conversation %s says its id is %r: ignored, the file name is the id", found.path.name, claimed)
        known = {k: raw[k] for k in _FIELDS if k in raw and k != "id"}
        extra = {k: v for k, v in raw.items() if k not in _FIELDS}
        return Conversation(id=conversation_id, **known, extra=extra)

    def _set_aside(self, path: Path, reason: str) -> SetAside:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            backup = path.with_name(f"{path.stem}.{stamp}{f'-{n}' if n else ''}{BACKUP_SUFFIX}")
            if backup.exists() or backup.is_symlink():
                continue  # an earlier bad copy: never overwrite it
            try:
                path.rename(backup)
            except OSError as exc:
                log.error("conversation %s is unreadable (%s) and could not be set aside: %s", path.name, reason, exc)
                return SetAside(path, None, reason)
            log.warning("set aside unreadable conversation %s as %s: %s", path.name, backup.name, reason)
            return SetAside(path, backup, reason)
        log.error("conversation %s is unreadable (%s); left in place: no free backup name", path.name, reason)
        return SetAside(path, None, reason)


def describe_set_aside(set_aside: tuple[SetAside, ...] | list[SetAside], shown: int = 3) -> str:
    """One line for the window's notice: how many files were set aside, which, and where; '' if none."""
    if not set_aside:
        return ""
    n = len(set_aside)
    moved = [a for a in set_aside if a.backup is not None]
    names = ", ".join(a.backup.name for a in moved[:shown]) + (f" and {len(moved) - shown} more" if len(moved) > shown else "")
    where = set_aside[0].original.parent
    text = f"{n} conversation file{'s' if n != 1 else ''} could not be read"
    if moved:
        text += f" and {'were' if len(moved) != 1 else 'was'} set aside, not deleted: {names} in {where}."
    if len(moved) < n:
        text += f" {n - len(moved)} could not be renamed and {'were' if n - len(moved) != 1 else 'was'} left in {where}."
    return text + " The log says why."


def _write_atomically(directory: Path, target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(directory)  # the rename itself survives a power cut


def _fsync_directory(directory: Path) -> None:
    if os.name != "posix":
        return  # Windows cannot open a directory to fsync it; its rename is durable enough
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
