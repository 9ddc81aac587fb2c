"""A saved chat turn as the model reads it: attached files written into the user's turn as fenced
blocks, a tool's result and a reply's tool calls as the chat template writes them.

The app's conversations (app/store/conversations.py) and `tandem distill --conversations`
(engine.distill.conversations) both build prompts from saved turns here, so a conversation reads
the same to the model in the chat and in the data a drafter learns from.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from engine.session.chat import for_the_model
from engine.tools.calls import arguments_for_template

#: Fence languages by suffix, so the model reads the block as the code it is.
LANGUAGES = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".ts": "typescript",
    ".tsx": "tsx", ".jsx": "jsx", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp",
    ".cs": "csharp", ".java": "java", ".kt": "kotlin", ".go": "go", ".rs": "rust", ".rb": "ruby",
    ".php": "php", ".swift": "swift", ".sh": "bash", ".bash": "bash", ".zsh": "zsh", ".ps1": "powershell",
    ".sql": "sql", ".html": "html", ".css": "css", ".scss": "scss", ".json": "json", ".yaml": "yaml",
    ".yml": "yaml", ".toml": "toml", ".ini": "ini", ".xml": "xml", ".md": "markdown", ".rst": "rst",
    ".tex": "latex", ".r": "r", ".lua": "lua", ".pl": "perl", ".scala": "scala", ".dart": "dart",
    ".m": "objectivec", ".jl": "julia", ".hs": "haskell", ".ex": "elixir", ".erl": "erlang",
    ".vue": "vue", ".svelte": "svelte", ".dockerfile": "dockerfile", ".cmake": "cmake", ".mk": "make",
}
_NAMED = {"dockerfile": "dockerfile", "makefile": "make", "cmakelists.txt": "cmake"}


def language(name: str) -> str:
    lower = name.lower()
    return _NAMED.get(lower) or LANGUAGES.get(Path(lower).suffix, "")


def file_block(name: str, text: str, kind: str = "text") -> str:
    """An attached file as the model reads it: its name, then its text in a fence longer than any
    run of backticks inside it (so a Markdown file's own fences cannot close it)."""
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    lang = "" if kind == "pdf" else language(name)
    body = text if text.endswith("\n") else text + "\n"
    return f"File: {name}\n{fence}{lang}\n{body}{fence}"


def user_content(text: str, attachments: Iterable[dict] = ()) -> str:
    """A user turn's content: each attached file's block ({"name", "text", "kind"}), then what the
    person typed."""
    blocks = [file_block(a["name"], a["text"], a.get("kind", "text")) for a in attachments]
    if not blocks:
        return text
    return "\n\n".join(blocks + ([text] if text else []))


def model_turn(message: dict) -> dict:
    """A saved message ({"role", "content", optional "attachments", "tool_calls", "outcome"}) as
    the chat template's message."""
    if message["role"] == "tool":  # the result as the model read it (engine.session.chat)
        return {"role": "tool", "content": for_the_model(None if message.get("outcome") == "declined" else message["content"])}
    turn = {"role": message["role"], "content": user_content(message["content"], message.get("attachments") or ())}
    if message.get("tool_calls"):
        turn["tool_calls"] = [{"type": "function", "function": {
            "name": c["name"], "arguments": arguments_for_template(c["arguments"])}} for c in message["tool_calls"]]
    return turn
