"""One chat turn: the conversation so far in, the assistant's reply streamed out.

Speculation is on by default (the drafter is the caller's choice); each Tokens event comes with
its text split by origin so a chat view can show which words the drafter got right.

``chat_with_tools`` is a turn with tools (an MCP server's, engine.tools.mcp): the tools go to
the chat template; where the reply calls some, each call goes to the caller's ``run_tool``
(which asks the user, then runs it, or declines), its result joins the conversation as a
``tool`` turn, and the model replies again, from the kept prefix: only the call's result is
new to prefill. At most ``max_rounds`` replies a turn, the last one without tools on offer.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.events import Failed, Finished, Tokens
from engine.core.settings import DecodeSettings
from engine.decode.token_origin import OriginTracker
from engine.session.side_by_side import LaneEvent
from engine.tools.calls import ToolCall, arguments_for_template, parse
from engine.tools.mcp import ToolResult, ToolSpec

if TYPE_CHECKING:
    from engine.session.session import DrafterKind, Session

CHAT = "chat"


def chat_reply(
    session: Session,
    messages: list[dict],
    settings: DecodeSettings,
    drafter: DrafterKind = "model",
    cancel: Callable[[], bool] = lambda: False,
    tools: list[dict] | None = None,
) -> Iterator[LaneEvent]:
    """``messages``: [{"role": "user"|"assistant"|"system"|"tool", "content": str, ...}, ...],
    ending with the user's turn (or a tool's result); ``tools``: OpenAI ``tools`` entries."""
    if not messages or messages[-1].get("role") not in ("user", "tool"):
        yield LaneEvent(CHAT, Failed("a chat turn needs the user's message last"))
        return
    try:
        prompt_ids = session.encode(messages, tools=tools)
    except ValueError as exc:
        yield LaneEvent(CHAT, Failed(str(exc)))
        return
    origins = OriginTracker(session.tokenizer)
    for event in session.speculative(prompt_ids, settings, drafter, cancel):
        segments = origins.feed(event.token_ids, event.from_draft, event.text) if isinstance(event, Tokens) else ()
        yield LaneEvent(CHAT, event, segments)


@dataclass(frozen=True)
class ReplyCalledTools:
    """The reply just finished called ``calls``; ``content`` is its text besides them (None:
    none). A chat keeps this as the assistant's turn in place of the reply's raw text."""

    content: str | None
    calls: tuple[ToolCall, ...]
    round: int


@dataclass(frozen=True)
class ToolCallAsked:
    """The reply called a tool; ``run_tool`` is asked next."""

    call: ToolCall
    round: int


@dataclass(frozen=True)
class ToolCallAnswered:
    """A call's outcome: its result (as the model reads it), or declined by the user."""

    call: ToolCall
    result: ToolResult | None  # None: declined
    round: int


MAX_TOOL_ROUNDS = 4


def chat_with_tools(
    session: Session,
    messages: list[dict],
    settings: DecodeSettings,
    tools: list[ToolSpec],
    run_tool: Callable[[ToolCall], ToolResult | None],
    drafter: DrafterKind = "model",
    cancel: Callable[[], bool] = lambda: False,
    max_rounds: int = MAX_TOOL_ROUNDS,
) -> Iterator[LaneEvent | ReplyCalledTools | ToolCallAsked | ToolCallAnswered]:
    """A chat turn with ``tools``: each reply's events as ``chat_reply``'s, then, where it
    called tools, a ReplyCalledTools, a ToolCallAsked and a ToolCallAnswered per call and the
    next reply. The last LaneEvent's Finished is the turn's answer. ``messages`` is not changed;
    the turns the tools added are in each ToolCallAnswered.

    Small models repeat a call whose result they already have. A call made earlier in the turn
    with the same arguments is answered from that result, not run (nor asked) again, and the
    reply after it, like the turn's last (``max_rounds``), is asked without tools on offer: it
    answers in words from the results it has."""
    offered = [t.to_openai() for t in tools]
    names = frozenset(t.name for t in tools)
    conversation = list(messages)
    answered: dict[tuple[str, str], ToolResult | None] = {}
    repeated = False
    for round_ in range(1, max_rounds + 1):
        finished = None
        last = round_ == max_rounds or repeated
        for item in chat_reply(session, conversation, settings, drafter, cancel, tools=None if last else offered or None):
            if isinstance(item.event, Finished):
                finished = item.event
            yield item
        if finished is None or finished.reason == "cancelled":
            return
        content, calls = parse(finished.text, names)
        if not calls:
            return
        if last:
            yield LaneEvent(CHAT, Failed(f"the model kept calling tools; stopped after {round_} "
                                         f"repl{'ies' if round_ != 1 else 'y'}"))
            return
        yield ReplyCalledTools(content, calls, round_)
        conversation.append({"role": "assistant", "content": content or "", "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": arguments_for_template(c.arguments)}} for c in calls]})
        for call in calls:
            key = (call.name, _same_arguments(call.arguments))
            if key in answered:
                repeated = True
                result = answered[key]
            else:
                yield ToolCallAsked(call, round_)
                result = answered[key] = run_tool(call)
            yield ToolCallAnswered(call, result, round_)
            conversation.append({"role": "tool", "content": for_the_model(result.text if result else None)})
            if cancel():
                return


# Small models (the 1.5B coder) read a bare result as a cue to call the tool again; told what
# to do with it, they answer from it (and, declined, say they cannot, rather than make one up).
DECLINED = "The user declined to run this tool. Answer without it, and do not call it again."
FROM_THE_RESULT = "\n\n(Answer the user from this result; call a tool again only for something it does not say.)"


def for_the_model(result: str | None) -> str:
    """A tool turn's content as the model reads it: the call's result (None: declined) and what to
    do with it. A chat that keeps the result alone renders it with this again."""
    return DECLINED if result is None else result + FROM_THE_RESULT


def _same_arguments(arguments: str) -> str:
    """A call's arguments in one spelling (key order and spacing aside)."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments

