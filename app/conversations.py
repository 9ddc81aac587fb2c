"""Chat history on disk: one JSON file per conversation under the user data dir.

Writes are atomic (temp file, fsync, rename), so a crash or a kill mid-save leaves either the
old file or the new one, never a torn one. A file that cannot be read is set aside, not deleted.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    messages: list[dict] = field(default_factory=list)  # {"role", "content", optional "stats"}

    def chat_messages(self) -> list[dict]:
        """What the model sees: roles and contents only."""
        return [{"role": m["role"], "content": m["content"]} for m in self.messages]


class ConversationStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, conversation_id: str) -> Path:
        return self.directory / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> None:
        conversation.updated = time.time()
        data = json.dumps(asdict(conversation), ensure_ascii=False, indent=1)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(conversation.id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_all(self) -> list[Conversation]:
        """Newest first. Unreadable files are renamed *.unreadable and skipped."""
        out = []
        for path in self.directory.glob("*.json"):
            if path.name.startswith(".tmp-"):
                continue
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                out.append(Conversation(**{k: raw[k] for k in ("id", "title", "created", "updated", "messages")}))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("setting aside unreadable conversation %s: %s", path.name, exc)
                path.rename(path.with_suffix(".unreadable"))
        return sorted(out, key=lambda c: c.updated, reverse=True)

    def delete(self, conversation_id: str) -> None:
        self.path(conversation_id).unlink(missing_ok=True)
