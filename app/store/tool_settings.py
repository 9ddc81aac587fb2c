"""Which MCP servers the chat offers the model, and whether each call is confirmed first.

A server is a name and a command line (split as a shell splits words, run without a shell, so
quotes work and nothing else a shell does happens). Kept in the app's settings as one JSON
value; a value that is not valid (a hand-edited file) reads as no servers, with the reason
logged, never a crash.
"""
from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass

from app.store.app_settings import AppSettings, Key
from engine.tools.mcp import McpServerConfig

log = logging.getLogger(__name__)
MAX_SERVERS = 16
MAX_NAME = 40
MAX_COMMAND = 4096


class BadToolSettings(ValueError):
    """The message says which server and what is wrong with it."""


@dataclass(frozen=True)
class McpEntry:
    name: str
    command: str  # a command line: the program, then its arguments
    enabled: bool = True

    def argv(self) -> list[str]:
        try:
            words = shlex.split(self.command)
        except ValueError as exc:  # an unclosed quote
            raise BadToolSettings(f"the command of {self.name!r} cannot be read: {exc}") from None
        if not words:
            raise BadToolSettings(f"{self.name!r} has no command")
        return words

    def config(self) -> McpServerConfig:
        program, *args = self.argv()
        return McpServerConfig(self.name, program, tuple(args))


@dataclass(frozen=True)
class ToolSettings:
    servers: tuple[McpEntry, ...] = ()
    confirm: bool = True  # ask the user before each call runs

    def configs(self) -> tuple[McpServerConfig, ...]:
        """The enabled servers, ready to start."""
        return tuple(s.config() for s in self.servers if s.enabled)

    def check(self) -> None:
        """Raise BadToolSettings naming the first problem."""
        if len(self.servers) > MAX_SERVERS:
            raise BadToolSettings(f"at most {MAX_SERVERS} servers")
        seen = set()
        for server in self.servers:
            name = server.name.strip()
            if not name:
                raise BadToolSettings("every server needs a name")
            if len(name) > MAX_NAME:
                raise BadToolSettings(f"the name {name[:MAX_NAME]!r}… is longer than {MAX_NAME} characters")
            if name in seen:
                raise BadToolSettings(f"two servers are named {name!r}")
            seen.add(name)
            if len(server.command) > MAX_COMMAND:
                raise BadToolSettings(f"the command of {name!r} is longer than {MAX_COMMAND} characters")
            server.argv()

    def to_json(self) -> dict:
        return {"servers": [{"name": s.name, "command": s.command, "enabled": s.enabled} for s in self.servers],
                "confirm": self.confirm}

    @classmethod
    def from_json(cls, raw: object) -> ToolSettings:
        if not isinstance(raw, dict) or not isinstance(raw.get("servers", []), list):
            raise BadToolSettings("not a tools setting")
        servers = []
        for item in raw.get("servers", []):
            if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("command"), str)
                    and isinstance(item.get("enabled", True), bool)):
                raise BadToolSettings(f"not a server: {str(item)[:80]}")
            servers.append(McpEntry(item["name"], item["command"], item.get("enabled", True)))
        confirm = raw.get("confirm", True)
        settings = cls(tuple(servers), confirm if isinstance(confirm, bool) else True)
        settings.check()
        return settings


def load_tool_settings(settings: AppSettings | None) -> ToolSettings:
    if settings is None:
        return ToolSettings()
    text = settings.get(Key.CHAT_TOOLS, "") or ""
    if not text:
        return ToolSettings()
    try:
        return ToolSettings.from_json(json.loads(text))
    except (ValueError, RecursionError) as exc:
        log.warning("the saved MCP servers are not valid, so none are offered: %s", exc)
        return ToolSettings()


def save_tool_settings(settings: AppSettings | None, tools: ToolSettings) -> None:
    tools.check()
    if settings is not None:
        settings.set(Key.CHAT_TOOLS, json.dumps(tools.to_json()))
