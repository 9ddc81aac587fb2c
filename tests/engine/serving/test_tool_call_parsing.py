"""Reading a reply's tool calls, whole and while it streams (engine.tools.calls)."""
import json

import pytest

from engine.tools.calls import StreamSplitter, ToolCall, call_grammar, parse, template_writes_calls

NAMES = frozenset({"get_weather", "search_code"})
BLOCK = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>'
WEATHER = ToolCall("get_weather", '{"city": "Lisbon"}')

REPLIES = [
    # (reply, content, calls)
    (BLOCK, None, (WEATHER,)),
    ("Let me look.\n" + BLOCK, "Let me look.", (WEATHER,)),
    (BLOCK + "\n" + BLOCK.replace("Lisbon", "Porto"), None, (WEATHER, ToolCall("get_weather", '{"city": "Porto"}'))),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n```', None, (WEATHER,)),
    ('{"name": "get_weather", "arguments": {"city": "Lisbon"}}', None, (WEATHER,)),
    # Not calls: broken JSON in a block, a tool nobody offered, code, an object that merely has a name.
    ("<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>", ()),
    ('{"name": "rm_rf", "arguments": {}}', '{"name": "rm_rf", "arguments": {}}', ()),
    ("```python\nprint('<tool')\n```", "```python\nprint('<tool')\n```", ()),
    ('{"name": "get_weather", "age": 3}', '{"name": "get_weather", "age": 3}', ()),
    ("The <tool_call> tag opens a call.", "The <tool_call> tag opens a call.", ()),
]


@pytest.mark.parametrize("reply,content,calls", REPLIES)
def test_a_reply_is_read_into_content_and_calls(reply, content, calls):
    assert parse(reply, NAMES) == (content, calls)


@pytest.mark.parametrize("reply,content,calls", REPLIES)
@pytest.mark.parametrize("piece", [1, 3, 64])
def test_streamed_the_same_reply_gives_the_same_content_and_calls(reply, content, calls, piece):
    splitter = StreamSplitter(NAMES)
    sent = "".join(splitter.feed(reply[i:i + piece]) for i in range(0, len(reply), piece))
    rest, streamed_calls = splitter.finish()
    assert streamed_calls == calls
    assert "<tool_call>" not in sent or not calls
    if calls:
        assert (sent + rest).strip() == (content or "")
    else:
        assert sent + rest == reply  # text that held no call goes out whole, nothing lost


def test_text_streams_as_it_comes_until_a_call_may_begin():
    splitter = StreamSplitter(NAMES)
    assert splitter.feed("Checking the weather") == "Checking the weather"
    assert splitter.feed(" now <tool") == " now "  # "<tool" may open a call: held
    assert splitter.feed("_call>\n{") == ""
    splitter.feed('"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>')
    assert splitter.finish() == ("", (WEATHER,))


def test_the_openai_shape_of_a_call():
    call = WEATHER.to_openai(0)
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Lisbon"}


def test_templates_and_grammars():
    assert template_writes_calls("{% if tools %}...<tool_call>...{% endif %}")
    assert not template_writes_calls("{{ messages }}") and not template_writes_calls(None)
    grammar = call_grammar([{"function": {"name": "f", "parameters": {"type": "object"}}}], None, (7, 8))
    assert grammar.startswith("start: <[7]> ") and grammar.endswith("<[8]>")
    with pytest.raises(ValueError, match="nope"):
        call_grammar([{"function": {"name": "f"}}], "nope")
