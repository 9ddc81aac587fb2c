"""The chat's MCP servers on the engine's worker thread: started once and kept between turns,
each call of the model's confirmed by the person first (unless they turned that off), run with
the server's deadline, and its outcome handed back to the model.

A server that does not start, or dies, costs the turn its tools, not the turn: the chat goes on
without them and a notice names the server and why. Servers left running are stopped when the
engine thread ends (the worker's exit hooks).
"""
from __future__ import annotations

import json
import logging
import queue

from app.bridge.messages import ToolConfirm, ToolNotice
from engine.tools.calls import ToolCall, template_writes_calls
from engine.tools.mcp import McpServer, McpServerConfig, ToolError, ToolResult, ToolSpec

log = logging.getLogger(__name__)
ANSWER_POLL_S = 0.1  # how often a wait for the person's answer looks at Stop


class McpPool:
    """The running servers, by their configuration (a changed command starts a new one)."""

    def __init__(self) -> None:
        self.servers: dict[McpServerConfig, McpServer] = {}
        self.owner: dict[str, McpServer] = {}  # tool name -> the server that has it

    def ensure(self, configs: tuple[McpServerConfig, ...]) -> tuple[list[ToolSpec], list[str]]:
        """Start what is configured and not running, stop what is no longer configured; the
        tools on offer and what went wrong (one line a server)."""
        for config, server in list(self.servers.items()):
            if config not in configs or not server.alive:
                server.close()
                del self.servers[config]
        problems = []
        for config in configs:
            if config not in self.servers:
                server = McpServer(config)
                try:
                    server.start()
                except ToolError as exc:
                    problems.append(f"Tools of {config.name!r} are not offered: {exc}")
                    continue
                self.servers[config] = server
        tools, self.owner = [], {}
        for config in configs:
            server = self.servers.get(config)
            for tool in server.tools if server else ():
                if tool.name in self.owner:
                    problems.append(f"{config.name!r} and {self.owner[tool.name].config.name!r} both have a tool "
                                    f"named {tool.name!r}: the first one is offered")
                    continue
                self.owner[tool.name] = server
                tools.append(tool)
        return tools, problems

    def call(self, call: ToolCall) -> ToolResult:
        """Run ``call``; a failure becomes a result that says so (the model reads it)."""
        server = self.owner.get(call.name)
        if server is None:
            return ToolResult(f"There is no tool named {call.name!r}.", is_error=True)
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return ToolResult(f"The arguments of {call.name} are not JSON: {call.arguments[:200]}", is_error=True)
        if not isinstance(arguments, dict):
            return ToolResult(f"The arguments of {call.name} must be a JSON object.", is_error=True)
        try:
            return server.call(call.name, arguments)
        except ToolError as exc:
            return ToolResult(f"The tool failed: {exc}", is_error=True)

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()
        self.owner.clear()


def pool(ctx) -> McpPool:
    if ctx.state.tools is None:
        ctx.state.tools = McpPool()
        ctx.state.at_exit.append(ctx.state.tools.close)
    return ctx.state.tools


def model_takes_tools(ctx, session) -> bool:
    """Whether the model's chat template writes tool calls (Qwen / Hermes style); if not, the
    window is told so once per model, and its turns go without tools."""
    if template_writes_calls(getattr(session.tokenizer, "chat_template", None)):
        return True
    told = ctx.state.tools_refused_for
    if session.target.name not in told:
        told.add(session.target.name)
        ctx.emit(ToolNotice(f"{session.target.name}'s chat template has no format for tool calls, so its "
                            "chats go without the MCP servers' tools."))
    return False


def tools_for_turn(ctx, configs: tuple[McpServerConfig, ...]) -> list[ToolSpec]:
    """The tools this turn offers; each server that could not start is told to the window."""
    tools, problems = pool(ctx).ensure(configs)
    for problem in problems:
        log.warning("%s", problem)
        ctx.emit(ToolNotice(problem))
    return tools


def tool_runner(ctx, confirm: bool):
    """``run_tool`` for engine.session.chat.chat_with_tools: asks the window first when
    ``confirm``; None (declined) when the person says no or presses Stop."""
    servers = pool(ctx)

    def run(call: ToolCall) -> ToolResult | None:
        if confirm:
            answer: queue.Queue[bool] = queue.Queue()
            owner = servers.owner.get(call.name)
            ctx.emit(ToolConfirm(call.name, call.arguments, owner.config.name if owner else "", answer))
            while True:
                try:
                    if not answer.get(timeout=ANSWER_POLL_S):
                        return None
                    break
                except queue.Empty:
                    if ctx.cancelled():
                        return None
        return servers.call(call)

    return run
