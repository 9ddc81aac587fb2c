"""The MCP client against a real MCP server process over stdio (tests/engine/tools/mcp_server.py,
the mcp SDK's own server): tools listed as OpenAI describes them, calls answered, and each way a
server can misbehave bounded and said in one line naming it."""
import sys

import psutil
import pytest

from engine.tools.mcp import MAX_RESULT_CHARS, McpServer, McpServerConfig, ToolError

SERVER = McpServerConfig("test", sys.executable, ("-m", "tests.engine.tools.mcp_server"))


@pytest.fixture
def server():
    running = McpServer(SERVER)
    running.start()
    yield running
    running.close()


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_tools_are_listed_in_openai_shape_and_calls_answer(server):
    tools = {t.name: t for t in server.tools}
    assert {"add", "weather", "hang", "flood", "die", "fail"} <= set(tools)
    add = tools["add"].to_openai()
    assert add["type"] == "function" and add["function"]["description"] == "Add two integers."
    assert add["function"]["parameters"]["required"] == ["a", "b"]
    assert server.call("add", {"a": 2, "b": 40}).text == "42"
    assert '"temperature": 21' in server.call("weather", {"city": "Lisbon"}).text


def test_a_failing_tool_is_an_error_result_and_the_server_goes_on(server):
    result = server.call("fail", {})
    assert result.is_error and "fail" in result.text
    assert server.call("add", {"a": 1, "b": 1}).text == "2"


def test_a_hanging_call_times_out_and_the_server_still_answers(server):
    with pytest.raises(ToolError, match=r"'test'.*hang did not answer within 1 s"):
        server.call("hang", {}, timeout_s=1)
    assert server.call("add", {"a": 3, "b": 4}).text == "7"


def test_a_flood_is_cut_and_says_so(server):
    result = server.call("flood", {})
    assert result.truncated and len(result.text) < MAX_RESULT_CHARS + 200
    assert "the result was cut here: 10,000,000 characters" in result.text


def test_a_server_that_exits_mid_call_fails_that_call_and_later_ones_clearly(server):
    with pytest.raises(ToolError, match="'test' failed to call die"):
        server.call("die", {}, timeout_s=20)
    assert not server.alive
    with pytest.raises(ToolError, match="'test' is not running"):
        server.call("add", {"a": 1, "b": 2})


@pytest.mark.parametrize("config,match", [
    (McpServerConfig("gone", "/nonexistent/mcp-server"), "'gone' failed to start: .*No such file"),
    (McpServerConfig("quits", sys.executable, ("-m", "tests.engine.tools.mcp_server", "--exit-at-start")),
     "'quits' failed to start: .*; it said: tandem-test: no configuration found, exiting"),
    (McpServerConfig("silent", sys.executable, ("-c", "import time; time.sleep(60)")), "'silent' did not start within 3 s"),
])
def test_a_server_that_cannot_start_says_why_and_leaves_no_process(config, match):
    before = _children()
    with pytest.raises(ToolError, match=match):
        McpServer(config).start(timeout_s=3)
    left = _children() - before
    psutil.wait_procs([psutil.Process(p) for p in left if psutil.pid_exists(p)], timeout=10)
    assert not {p for p in left if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}


def test_closing_stops_the_server_process():
    before = _children()
    running = McpServer(SERVER)
    running.start()
    started = _children() - before
    assert started
    running.close()
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in started if psutil.pid_exists(p)], timeout=10)
    assert not alive
