"""A chat turn with an MCP server's tools, on the real default pair and a real stdio MCP
server: the model calls the tool, the call is asked and run, its result joins the
conversation, the model replies again; declining and a model that keeps calling are bounded."""
import json
import sys

import pytest

from engine.core.events import Failed, Finished
from engine.core.settings import DecodeSettings
from engine.models.loading import default_pair
from engine.session.chat import ToolCallAnswered, ToolCallAsked, chat_with_tools
from engine.session.session import Session
from engine.tools.mcp import McpServer, McpServerConfig

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the weather in Lisbon right now? Use the weather tool."}]


@pytest.fixture(scope="module")
def session():
    paths = default_pair.installed_paths()
    if paths is None:
        pytest.fail("default model pair not installed: run `make setup` first")
    return Session.load(default_pair.gguf_file(default_pair.TARGET), paths[1], precision="file")


@pytest.fixture(scope="module")
def mcp():
    server = McpServer(McpServerConfig("test", sys.executable, ("-m", "tests.engine.tools.mcp_server")))
    server.start()
    yield server
    server.close()


def _weather_only(mcp):
    return [t for t in mcp.tools if t.name == "weather"]


def test_the_model_calls_the_mcp_tool_and_replies_after_its_result(session, mcp):
    asked = []

    def run_tool(call):
        asked.append(call)
        return mcp.call(call.name, json.loads(call.arguments))

    items = list(chat_with_tools(session, QUESTION, DecodeSettings(max_new_tokens=80), _weather_only(mcp), run_tool,
                                 max_rounds=3))
    calls = [i for i in items if isinstance(i, ToolCallAsked)]
    answers = [i for i in items if isinstance(i, ToolCallAnswered)]
    assert calls and calls[0].call.name == "weather"
    assert "lisbon" in json.loads(calls[0].call.arguments)["city"].lower()
    assert answers[0].result is not None and '"temperature": 21' in answers[0].result.text
    finishes = [i.event for i in items if hasattr(i, "event") and isinstance(i.event, Finished)]
    assert len(finishes) >= 2 and "<tool_call>" not in finishes[-1].text  # the call, then the reply after its result
    assert len(asked) == 1  # a repeat of the call is answered from its result, not run again
    # The second reply reuses the first prompt's cache: only the call and its result are new.
    second = finishes[1].stats
    assert second.cached_tokens > finishes[0].stats.prompt_tokens // 2
    print(f"\ncalled {calls[0].call.name}({calls[0].call.arguments}); then: {finishes[1].text!r}"
          f" (prompt {second.prompt_tokens} tokens, {second.cached_tokens} reused)")


def test_a_declined_call_is_told_to_the_model_and_the_last_reply_has_no_tools(session, mcp):
    items = list(chat_with_tools(session, QUESTION, DecodeSettings(max_new_tokens=80), _weather_only(mcp),
                                 lambda call: None, max_rounds=1))
    assert [i for i in items if isinstance(i, ToolCallAsked)] == []  # one reply, the last: no tools offered
    finishes = [i.event for i in items if hasattr(i, "event") and isinstance(i.event, Finished)]
    assert len(finishes) == 1 and "<tool_call>" not in finishes[0].text
    assert not [i for i in items if hasattr(i, "event") and isinstance(i.event, Failed)]
    declined = list(chat_with_tools(session, QUESTION, DecodeSettings(max_new_tokens=80), _weather_only(mcp),
                                    lambda call: None, max_rounds=2))
    answered = [i for i in declined if isinstance(i, ToolCallAnswered)]
    assert answered and answered[0].result is None
