"""The schema of a conversation file, checked in full before anything uses it: by the app's
store (app/store/conversations.py) and by `tandem distill --conversations`, which reads the
same files, so both accept and refuse the same ones.

Strict types (a number is not a string, a bool is not a number, NaN is not a time), roles from a
fixed set, every content a string. Fields this version does not know are allowed and kept, so a
file written by a newer Tandem still loads. A new field of ``Conversation`` belongs here too
(tests/app/store/test_conversations.py checks the two agree).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

ROLES = ("system", "user", "assistant", "tool")


class SchemaError(ValueError):
    """The file is JSON but not a conversation; the message names each bad field."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class ReplyMetaSchema(_Strict):
    """What a reply was made with and how fast: shown on hover, kept for later comparison."""

    tok_per_s: float = 0.0
    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance: float = 0.0
    model: str = ""
    drafter: str = ""
    precision: str = ""
    finish: str = ""  # eos, max_new_tokens, stop_string, cancelled
    prompt_tokens: int = 0  # the conversation as the model read it (added later: older files have 0)
    cached_tokens: int = 0  # of them, kept from the previous reply's cache, not read again
    ttft_s: float | None = None  # seconds to the first token


class AttachmentSchema(_Strict):
    """A file attached to a user message (app/store/attachments.py): its text as the model read it."""

    name: str
    text: str
    kind: Literal["text", "pdf"] = "text"
    tokens: int | None = None  # with the tokenizer of the model it was sent to


class ToolCallSchema(_Strict):
    """A tool the reply called: its name and arguments (JSON text, as OpenAI sends them)."""

    name: str
    arguments: str


class MessageSchema(_Strict):
    role: Literal[ROLES]  # a tuple subscript is the same as listing the values
    content: str  # what the person typed (a user turn's attachments are kept apart, below)
    stats: str = ""  # the reply's speed line, shown under it
    meta: ReplyMetaSchema | None = None  # added later: older files have none
    attachments: list[AttachmentSchema] = []  # added later: older files have none
    tool_calls: list[ToolCallSchema] = []  # an assistant turn's calls (added later)
    name: str = ""  # a tool turn's tool
    outcome: Literal["ran", "failed", "declined", ""] = ""  # a tool turn's: what became of the call


class ConversationSchema(_Strict):
    id: str | None = None  # optional: the file name is the id
    title: str
    created: float
    updated: float
    messages: list[MessageSchema]
    system_prompt: str = ""  # added later: older files have none (no system message)


def validate(raw: object) -> dict:
    """``raw`` itself when it is a valid conversation; raises SchemaError saying what is wrong."""
    try:
        ConversationSchema.model_validate(raw)
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}" for e in exc.errors()[:5]]
        more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
        raise SchemaError("; ".join(problems) + more) from None
    return raw
