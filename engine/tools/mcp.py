"""Tools from MCP servers (stdio), for a chat whose model may call them.

The ``mcp`` SDK speaks the protocol; it is asynchronous, and the app and the engine are not.
``McpServer`` owns one server process and an asyncio loop on a thread of its own, and offers
blocking calls with deadlines: ``start`` (launch, handshake, list the tools), ``call`` and
``close``. What can go wrong with a server someone else wrote is bounded and said in one line
naming the server: it does not start or answer the handshake (START_TIMEOUT_S), a call hangs
(``timeout_s``), its process exits (the call fails, ``alive`` turns false), a result floods
(text past MAX_RESULT_CHARS is cut, and the cut is said in the text the model reads).

A server's own stderr goes to ``mcp-<name>.log`` in Tandem's log folder (the SDK would write it
to this process's stderr, which an app started from a desktop does not have), and a server that
fails to start has the last of what it wrote there quoted in the error.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0
# What a tool's result may put in front of the model: about 16k tokens, more than a context
# window of a small model can spare; the rest is cut with a note saying so.
MAX_RESULT_CHARS = 64 * 1024
MAX_TOOLS = 128


class ToolError(RuntimeError):
    """A server or one of its calls failed; the message names the server and says why."""


@dataclass(frozen=True)
class McpServerConfig:
    """How to start one MCP server: ``command`` and ``args`` (run without a shell), extra
    ``env``; ``name`` labels its tools and messages."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ToolSpec:
    """One tool as an OpenAI ``tools`` entry describes it, and the server that has it."""

    name: str
    description: str
    parameters: dict = field(default_factory=lambda: {"type": "object"})
    server: str = ""

    def to_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool = False
    truncated: bool = False


class McpServer:
    """One running MCP server. Not thread-safe between calls of its own: one caller at a time
    (a chat turn calls its tools one after another)."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.tools: tuple[ToolSpec, ...] = ()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{config.name}", daemon=True)
        self._stack: AsyncExitStack | None = None
        self._client = None
        self._dead: str | None = None
        self._errlog = None  # the server's stderr: a file in the log folder
        self._errlog_start = 0

    # -- the blocking API ---------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> tuple[ToolSpec, ...]:
        """Launch the server, shake hands and list its tools (ToolError on any failure)."""
        self._thread.start()
        self._errlog = _open_errlog(self.config.name)
        self._errlog_start = self._errlog.tell() if self._errlog.seekable() else 0
        try:
            self.tools = self._run(self._start(), timeout_s, "start")
        except ToolError as exc:
            said = self._last_words()
            self.close()
            raise ToolError(f"{exc}; it said: {said}" if said else str(exc)) from None
        return self.tools

    def _last_words(self, limit: int = 300) -> str:
        """The end of what the server wrote to its stderr since it was started."""
        if self._errlog is None or not getattr(self._errlog, "name", "").endswith(".log"):
            return ""
        try:
            self._errlog.flush()
            with open(self._errlog.name, encoding="utf-8", errors="replace") as f:
                f.seek(self._errlog_start)
                text = f.read()[-limit:].strip()
        except OSError:
            return ""
        return " / ".join(line.strip() for line in text.splitlines()[-3:] if line.strip())

    def call(self, name: str, arguments: dict, timeout_s: float = CALL_TIMEOUT_S) -> ToolResult:
        if self._dead is not None:
            raise ToolError(f"MCP server {self.config.name!r} is not running ({self._dead})")
        return self._run(self._call(name, arguments, timeout_s), timeout_s + 5.0, f"call {name}")  # _call's own first

    @property
    def alive(self) -> bool:
        return self._client is not None and self._dead is None

    def close(self) -> None:
        """Stop the server process (the SDK terminates it, then kills it) and the loop."""
        if self._thread.is_alive():
            if self._stack is not None:
                try:
                    asyncio.run_coroutine_threadsafe(self._stack.aclose(), self._loop).result(15)
                except Exception as exc:  # closing a broken connection: nothing left to save
                    log.debug("closing MCP server %s: %s", self.config.name, exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        self._stack = self._client = None
        self._dead = self._dead or "closed"
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    # -- on the loop's thread -----------------------------------------------------------------
    def _run(self, coroutine, timeout_s: float, what: str):
        # The deadline is kept on the loop, so that a call cut short unwinds there (the SDK then
        # stops a server process it had started) before this returns.
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, timeout_s), self._loop)
        try:
            return future.result(timeout_s + 15.0)
        except (asyncio.TimeoutError, FutureTimeout):
            future.cancel()
            raise ToolError(f"MCP server {self.config.name!r} did not {what} within {timeout_s:.0f} s") from None
        except ToolError:
            raise
        except Exception as exc:  # the SDK's errors, a process that exited, a broken pipe
            self._dead = f"{type(exc).__name__}: {exc}"
            raise ToolError(f"MCP server {self.config.name!r} failed to {what}: {_describe(exc)}") from None

    async def _start(self) -> tuple[ToolSpec, ...]:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(command=self.config.command, args=list(self.config.args),
                                       env=dict(self.config.env) or None)
        self._stack = AsyncExitStack()
        self._client = await self._stack.enter_async_context(Client(stdio_client(params, errlog=self._errlog),
                                                                    mode="legacy"))
        listing = await self._client.list_tools()
        tools = []
        for tool in listing.tools[:MAX_TOOLS]:
            schema = tool.input_schema if hasattr(tool, "input_schema") else getattr(tool, "inputSchema", None)
            tools.append(ToolSpec(tool.name, tool.description or "", dict(schema or {"type": "object"}),
                                  self.config.name))
        return tuple(tools)

    async def _call(self, name: str, arguments: dict, timeout_s: float) -> ToolResult:
        try:
            result = await asyncio.wait_for(self._client.call_tool(name, arguments), timeout_s)
        except asyncio.TimeoutError:
            raise ToolError(f"MCP server {self.config.name!r}: the tool {name} did not answer within "
                            f"{timeout_s:.0f} s") from None
        parts = []
        for block in result.content:
            text = getattr(block, "text", None)
            parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')} omitted]")
        structured = getattr(result, "structured_content", None)
        if not parts and structured is not None:
            parts.append(json.dumps(structured, ensure_ascii=False))
        text = "\n".join(parts)
        truncated = len(text) > MAX_RESULT_CHARS
        if truncated:
            text = (text[:MAX_RESULT_CHARS] + f"\n[the result was cut here: {len(text):,} characters, "
                    f"at most {MAX_RESULT_CHARS:,} are kept]")
        return ToolResult(text, bool(getattr(result, "is_error", False)), truncated)


def _open_errlog(name: str):
    """A file for a server's stderr: ``mcp-<name>.log`` in the log folder, else nowhere."""
    import os
    import re

    from engine.core.paths import log_dir

    try:
        folder = log_dir()
        folder.mkdir(parents=True, exist_ok=True)
        return open(folder / f"mcp-{re.sub(r'[^A-Za-z0-9_-]+', '-', name)[:40] or 'server'}.log", "a",
                    encoding="utf-8", errors="replace")
    except OSError as exc:
        log.warning("MCP server %s: its messages are dropped (%s)", name, exc)
        return open(os.devnull, "w")


def _describe(exc: BaseException) -> str:
    # anyio groups hide the cause one level down.
    inner = getattr(exc, "exceptions", None)
    if inner:
        return _describe(inner[0])
    return str(exc) or type(exc).__name__
