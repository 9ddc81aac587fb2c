"""One chat turn: the conversation so far in, the assistant's reply streamed out.

Speculation is on by default (the drafter is the caller's choice); each Tokens event comes with
its text split by origin so a chat view can show which words the drafter got right.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from engine.core.events import Failed, Tokens
from engine.core.settings import DecodeSettings
from engine.decode.token_origin import OriginTracker
from engine.session.side_by_side import LaneEvent

if TYPE_CHECKING:
    from engine.session.session import DrafterKind, Session

CHAT = "chat"


def chat_reply(
    session: Session,
    messages: list[dict],
    settings: DecodeSettings,
    drafter: DrafterKind = "model",
    cancel: Callable[[], bool] = lambda: False,
) -> Iterator[LaneEvent]:
    """``messages``: [{"role": "user"|"assistant"|"system", "content": str}, ...], ending with
    the user's turn."""
    if not messages or messages[-1].get("role") != "user":
        yield LaneEvent(CHAT, Failed("a chat turn needs the user's message last"))
        return
    try:
        prompt_ids = session.encode(messages)
    except ValueError as exc:
        yield LaneEvent(CHAT, Failed(str(exc)))
        return
    origins = OriginTracker(session.tokenizer)
    for event in session.speculative(prompt_ids, settings, drafter, cancel):
        segments = origins.feed(event.token_ids, event.from_draft, event.text) if isinstance(event, Tokens) else ()
        yield LaneEvent(CHAT, event, segments)
