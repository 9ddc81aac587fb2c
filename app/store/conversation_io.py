"""Conversations out of and back into Tandem: Markdown to read or share, JSON to move them.

The JSON export is ``{"format": FORMAT, "version": 1, "conversations": [...]}`` with each
conversation exactly as its file in the store holds it (engine/session/conversation_schema.py), so an import
validates each one with the same schema the store uses. Importing never overwrites a chat: an id
already taken gets a fresh one. An import is parsed with the store's bounds on depth
(app/store/json_files.py); its file may be bigger than one conversation's, up to ``MAX_IMPORT_BYTES``.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

from app.store import json_files
from app.store.attachments import Attachment, block
from app.store.conversations import Conversation, is_valid_id
from engine.session.conversation_schema import SchemaError, validate

FORMAT = "tandem-conversations"
VERSION = 1
#: An export of every chat: many conversations, each at most json_files.MAX_BYTES.
MAX_IMPORT_BYTES = 512 * 2**20
_FIELDS = ("title", "created", "updated", "messages", "system_prompt")


def to_markdown(conversation: Conversation) -> str:
    """A readable transcript: title, system prompt, then each turn under its speaker."""
    out = [f"# {conversation.title}", ""]
    if conversation.system_prompt.strip():
        out += ["**System prompt:**", "", *(f"> {line}" for line in conversation.system_prompt.splitlines()), ""]
    for message in conversation.messages:
        speaker = {"user": "You", "assistant": "Assistant", "system": "System"}[message["role"]]
        out += [f"## {speaker}", ""]
        for raw in message.get("attachments") or ():  # each attached file as the model read it
            out += [block(Attachment.from_json(raw)), ""]
        out += [message["content"], ""]
        if message.get("stats"):
            out += [f"*{message['stats']}*", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def all_to_markdown(conversations: list[Conversation]) -> str:
    return "\n---\n\n".join(to_markdown(c) for c in conversations)


def to_json(conversations: list[Conversation]) -> str:
    payload = {"format": FORMAT, "version": VERSION, "conversations": [c.to_json() for c in conversations]}
    return json.dumps(payload, ensure_ascii=False, indent=1, allow_nan=False) + "\n"


def from_json(text: str, taken_ids: set[str] | frozenset[str] = frozenset()) -> list[Conversation]:
    """Conversations from a JSON export (or a single conversation file). Raises ValueError naming
    the first bad conversation; nothing is imported then."""
    raw = json_files.loads(text)
    if isinstance(raw, dict) and raw.get("format") == FORMAT:
        if raw.get("version") != VERSION:
            raise ValueError(f"this export is version {raw.get('version')!r}; this Tandem reads version {VERSION}")
        items = raw.get("conversations")
        if not isinstance(items, list):
            raise ValueError("the export has no list of conversations")
    else:
        items = [raw]  # one conversation file copied out of the store
    out, used = [], set(taken_ids)
    for n, item in enumerate(items, 1):
        try:
            validate(item)
        except SchemaError as exc:
            raise ValueError(f"conversation {n} is not valid: {exc}") from None
        wanted = item.get("id")
        conversation_id = wanted if is_valid_id(wanted) and wanted not in used else uuid.uuid4().hex[:12]
        used.add(conversation_id)
        known = {k: item[k] for k in _FIELDS if k in item}
        extra = {k: v for k, v in item.items() if k not in _FIELDS and k != "id"}
        out.append(Conversation(id=conversation_id, **known, extra=extra))
    return out


def read_import(path: Path, taken_ids: set[str] | frozenset[str] = frozenset()) -> list[Conversation]:
    """``from_json`` of the file ``path``: a regular file up to MAX_IMPORT_BYTES (ValueError else)."""
    return from_json(json_files.read_text(Path(path), MAX_IMPORT_BYTES), taken_ids)


def export(conversations: list[Conversation], path: Path) -> Path:
    """Write ``conversations`` to ``path``: Markdown for a .md name, JSON otherwise."""
    path = Path(path)
    text = all_to_markdown(conversations) if path.suffix.lower() in (".md", ".markdown") else to_json(conversations)
    path.write_text(text, encoding="utf-8")
    return path
