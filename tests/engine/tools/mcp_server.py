"""A real MCP server over stdio for the client's tests (the mcp SDK's own server):

    python -m tests.engine.tools.mcp_server [--exit-at-start] [--only NAME,NAME]

tools: add (two integers), weather (a city's made-up weather), hang (never answers),
flood (a 10 MB result), die (the process exits mid-call), fail (the tool raises); --only
offers just the named ones (a chat's model then has only those to choose from).
"""
from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("tandem-test")


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> str:
    return str(a + b)


@server.tool(description="The current weather in a city.")
def weather(city: str) -> str:
    return f'{{"city": "{city}", "temperature": 21, "sky": "clear"}}'


@server.tool(description="Never answers.")
def hang() -> str:
    time.sleep(3600)
    return "late"


@server.tool(description="Answers 10 MB of text.")
def flood() -> str:
    return "x" * 10_000_000


@server.tool(description="The server exits while answering.")
def die() -> str:
    os._exit(3)


@server.tool(description="Fails.")
def fail() -> str:
    raise ValueError("the disk is on fire")


if __name__ == "__main__":
    if "--exit-at-start" in sys.argv:
        print("tandem-test: no configuration found, exiting", file=sys.stderr)
        sys.exit(2)
    if "--only" in sys.argv:
        keep = set(sys.argv[sys.argv.index("--only") + 1].split(","))
        for name in [t for t in ("add", "weather", "hang", "flood", "die", "fail") if t not in keep]:
            server.remove_tool(name)
    server.run("stdio")
