"""OpenAI tool calls on models whose chat template writes them Hermes-style.

Qwen 2.5 / 3, Hermes and most fine-tunes of them are taught to call a tool by writing

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Lisbon"}}
    </tool_call>

after (or instead of) their text; their chat template lists the tools in the system turn and
renders earlier calls and ``tool`` results the same way. Small ones (the 1.5B coder) often
write the same object bare or in a ```json fence instead: a reply that is only that object
(or a list of them) naming an offered tool is read as the call too. This module reads a reply into
OpenAI's ``tool_calls`` (``parse``; ``StreamSplitter`` while it streams: text goes out as it
comes, up to where a call may begin), and builds the grammar that holds a reply to one call
when the request requires it (``tool_choice`` "required" or a named function), so that the
call always parses and its arguments follow the tool's JSON schema. A model whose template
has no such format gets a 400 for ``tools``: a reply it could not be read from would drop
the call silently.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from engine.core.settings import JSON_WHITESPACE

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def template_writes_calls(chat_template: str | None) -> bool:
    """Whether a chat template takes ``tools`` and writes calls as ``<tool_call>`` blocks."""
    return bool(chat_template) and "tools" in chat_template and OPEN in chat_template


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def to_openai(self, index: int | None = None) -> dict:
        call = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


def arguments_for_template(text: str):
    """A call's arguments (OpenAI's JSON text) as chat templates take them: a mapping, which
    they write with tojson; text that is not JSON stays text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _call(block: str) -> ToolCall | None:
    try:
        value = json.loads(block)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text already
        return ToolCall(value["name"], arguments)
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


_FENCED = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def _bare_calls(text: str, names: frozenset[str]) -> tuple[ToolCall, ...]:
    """The calls of a reply that is only a call object, or a list of them (fenced or not),
    each naming one of ``names``; () otherwise."""
    body = text.strip()
    fenced = _FENCED.match(body)
    body = fenced.group(1) if fenced else body
    try:
        value = json.loads(body)
    except ValueError:
        return ()
    items = value if isinstance(value, list) else [value]
    calls = [_call(json.dumps(item)) for item in items if isinstance(item, dict) and item.get("name") in names
             and isinstance(item.get("arguments", item.get("parameters")), dict)]
    return tuple(calls) if calls and len(calls) == len(items) else ()


def parse(text: str, names: frozenset[str] = frozenset()) -> tuple[str | None, tuple[ToolCall, ...]]:
    """(the reply's text without its call blocks, or None where only calls remain; the calls).
    A block that is not a call (broken JSON, no name) stays in the text, as the model wrote it.
    ``names``: the offered tools, for a reply that is a bare call object."""
    bare = _bare_calls(text, names) if names else ()
    if bare:
        return None, bare
    calls, kept, at = [], [], 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1))
        if call is None:
            continue
        kept.append(text[at:match.start()])
        at = match.end()
        calls.append(call)
    kept.append(text[at:])
    content = "".join(kept).strip() if calls else text
    return (content or None), tuple(calls)


class StreamSplitter:
    """Streamed text, held back from where a ``<tool_call>`` may begin (and, while the reply
    may still be a bare call object, from its start): what ``feed`` returns goes out as
    content; the rest is read by ``finish`` when the reply ends."""

    def __init__(self, names: frozenset[str] = frozenset()) -> None:
        self.names = names
        self.text = ""
        self.sent = 0
        self.in_call = False

    def _may_be_bare_call(self) -> bool:
        head = self.text.lstrip()
        if not self.names or self.sent:
            return False
        if not head or head.startswith("{") or head.startswith("["):
            return True
        if "```".startswith(head[:3]) and len(head) < 3:
            return True
        if head.startswith("```"):
            line, newline, _ = head[3:].partition("\n")
            return not newline or line.strip() in ("", "json")
        return False

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.in_call or self._may_be_bare_call():
            return ""
        start = self.text.find(OPEN, self.sent)
        if start >= 0:
            self.in_call = True
            out, self.sent = self.text[self.sent:start], start
            return out
        # Keep back a tail that could be the start of OPEN.
        safe = len(self.text)
        for n in range(min(len(OPEN) - 1, len(self.text) - self.sent), 0, -1):
            if OPEN.startswith(self.text[-n:]):
                safe = len(self.text) - n
                break
        out, self.sent = self.text[self.sent:safe], safe
        return out

    def finish(self) -> tuple[str, tuple[ToolCall, ...]]:
        """(text not yet sent that is content after all, the calls)."""
        content, calls = parse(self.text[self.sent:], self.names)
        if not calls:
            return self.text[self.sent:], ()
        return content or "", calls


def call_schema(tools: list[dict], name: str | None = None) -> dict:
    """The JSON schema of one call: to the function ``name``, or to any of ``tools``."""
    choices = []
    for tool in tools:
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        parameters = function.get("parameters") or {"type": "object"}
        choices.append({"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                        "required": ["name", "arguments"], "additionalProperties": False})
    if not choices:
        raise ValueError(f"tool_choice names {name!r}, which is not one of the tools")
    schema = choices[0] if len(choices) == 1 else {"anyOf": choices}
    return {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}


def marker_ids(tokenizer) -> tuple[int | None, int | None]:
    """The token ids of ``<tool_call>`` and ``</tool_call>`` where the vocabulary holds each as
    one added token (Qwen's do): a grammar must name those by id, their text is not theirs."""
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    return added.get(OPEN), added.get(CLOSE)


def call_grammar(tools: list[dict], name: str | None = None, ids: tuple[int | None, int | None] = (None, None)) -> str:
    """A Lark grammar (llguidance's) for a reply that is one call block, and only that; ``ids``:
    the markers' token ids (``marker_ids``)."""
    open_, close = (f"<[{i}]>" if i is not None else f'"{text}"' for i, text in zip(ids, (OPEN, CLOSE)))
    return f'start: {open_} "\\n" %json {json.dumps(call_schema(tools, name))} "\\n" {close}'
