"""`tandem serve` answers OpenAI ``tools`` requests with ``tool_calls``, on the real default pair
(Qwen2.5-Coder, whose chat template writes calls as <tool_call> blocks), read by the official
openai client: streamed and not, a required call held to the tool's schema, a tool's result
fed back for the final answer."""
import json

import jsonschema
import pytest

from engine.models.loading import default_pair
from engine.serving.server import ServerConfig, run_in_thread
from engine.session.session import Session

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False},
    },
}
SEARCH = {
    "type": "function",
    "function": {"name": "search_code", "description": "Search the repository for a text.",
                 "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 60}},
                                "required": ["query"]}},
}
QUESTION = [{"role": "user", "content": "What is the weather in Lisbon right now, in celsius?"}]


@pytest.fixture(scope="module")
def served():
    paths = default_pair.installed_paths()
    if paths is None:
        pytest.fail("default model pair not installed: run `make setup` first")
    from openai import OpenAI

    session = Session.load(default_pair.gguf_file(default_pair.TARGET), paths[1], precision="file")
    with run_in_thread(session, ServerConfig(port=0)) as handle:
        yield handle, OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def _check_call(call, name: str) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == name
    arguments = json.loads(call.function.arguments)
    schema = next(t for t in (WEATHER, SEARCH) if t["function"]["name"] == name)["function"]["parameters"]
    jsonschema.validate(arguments, schema)
    return arguments


def test_a_tool_call_comes_back_as_tool_calls_streamed_or_not_and_its_result_is_answered(served):
    handle, client = served
    common = dict(model=handle.worker.model_id, messages=QUESTION, tools=[WEATHER, SEARCH], temperature=0, max_tokens=96)
    reply = client.chat.completions.create(**common)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert "<tool_call>" not in (choice.message.content or "")
    arguments = _check_call(choice.message.tool_calls[0], "get_weather")
    assert "lisbon" in arguments["city"].lower()

    chunks = list(client.chat.completions.create(**common, stream=True))
    streamed = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in streamed] == [c.function.name for c in choice.message.tool_calls]
    assert [d.function.arguments for d in streamed] == [c.function.arguments for c in choice.message.tool_calls]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    # The tool's result goes back; the model answers in text.
    call = choice.message.tool_calls[0]
    follow_up = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    answer = client.chat.completions.create(**{**common, "messages": follow_up})
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage.prompt_tokens > reply.usage.prompt_tokens
    # The earlier call and the result reach the model as its template writes them. (What the
    # 1.5B coder makes of them varies: it often calls again.)
    from engine.serving.schemas import Message

    turns = [Message.model_validate(m).for_template() for m in follow_up]
    prompt = handle.worker.session.tokenizer.decode(handle.worker.encode_chat(turns, [WEATHER, SEARCH]))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": ' in prompt
    assert '<tool_response>\n{"temperature": 21, "sky": "clear"}\n</tool_response>' in prompt


def test_a_required_call_is_held_to_the_named_tools_schema(served):
    handle, client = served
    reply = client.chat.completions.create(
        model=handle.worker.model_id, temperature=0, max_tokens=96, tools=[WEATHER, SEARCH],
        tool_choice={"type": "function", "function": {"name": "search_code"}},
        messages=[{"role": "user", "content": "Where do we parse GGUF headers?"}],
        extra_body={"speculative": {"drafter": "model"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_call(choice.message.tool_calls[0], "search_code")
    plain = client.chat.completions.create(
        model=handle.worker.model_id, temperature=0, max_tokens=96, tools=[WEATHER, SEARCH],
        tool_choice={"type": "function", "function": {"name": "search_code"}},
        messages=[{"role": "user", "content": "Where do we parse GGUF headers?"}],
        extra_body={"speculative": {"enabled": False}})
    assert plain.choices[0].message.tool_calls[0].function.arguments == choice.message.tool_calls[0].function.arguments


def test_bad_tool_requests_are_refused_and_the_server_keeps_serving(served):
    import openai

    handle, client = served
    for kwargs, match in (
            (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "nope"),
            (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools"),
            (dict(tools=[WEATHER], response_format={"type": "json_object"}), "response_format")):
        with pytest.raises(openai.BadRequestError, match=match):
            client.chat.completions.create(model=handle.worker.model_id, max_tokens=8, messages=QUESTION, **kwargs)
    # tool_choice "none": the tools are not offered, the model answers in text.
    reply = client.chat.completions.create(model=handle.worker.model_id, max_tokens=24, temperature=0, messages=QUESTION,
                                           tools=[WEATHER], tool_choice="none")
    assert reply.choices[0].finish_reason in ("stop", "length") and not reply.choices[0].message.tool_calls
