"""`tandem serve` follows ``response_format``: the official openai client asks the real default
pair (its GGUF target, as the app runs it) for JSON that follows a schema, streamed and not,
speculating; the replies parse, validate, and equal plain decoding's."""
import json

import jsonschema
import pytest

from engine.models import default_pair
from engine.serving.server import ServerConfig, run_in_thread
from engine.session.session import Session

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}},
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
FUNCTION = {
    "type": "object",
    "properties": {"function_name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$", "maxLength": 40},
                   "arguments": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5},
                   "returns": {"enum": ["int", "str", "bool", "list", "None"]}},
    "required": ["function_name", "arguments", "returns"],
    "additionalProperties": False,
}
CASES = [
    ("Describe Ada Lovelace as a person record.", PERSON),
    ("Describe a Python function that checks whether a string is a palindrome.", FUNCTION),
    ("Invent a software engineer from Lisbon who writes Rust and Go.", PERSON),
]


@pytest.fixture(scope="module")
def served():
    paths = default_pair.installed_paths()
    if paths is None:
        pytest.fail("default model pair not installed: run `make setup` first")
    from openai import OpenAI

    session = Session.load(default_pair.gguf_file(default_pair.TARGET), paths[1], precision="file")
    with run_in_thread(session, ServerConfig(port=0)) as handle:
        yield handle, OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}


def test_json_schema_replies_validate_streamed_or_not_and_equal_plain_decoding(served):
    handle, client = served
    drafted = 0
    for prompt, schema in CASES:
        common = dict(model=handle.worker.model_id, messages=[{"role": "user", "content": prompt}], temperature=0,
                      max_tokens=160, response_format=_format(schema))
        plain = client.chat.completions.create(**common, extra_body={"speculative": {"enabled": False}})
        reply = client.chat.completions.create(**common, extra_body={"speculative": {"drafter": "model"}})
        chunks = list(client.chat.completions.create(**common, stream=True, extra_body={"speculative": {"drafter": "model"}}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        text = reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop", text
        jsonschema.validate(json.loads(text), schema)
        assert text == plain.choices[0].message.content == streamed
        drafted += reply.model_extra["timings"]["draft_n"]
        print(f"\n{prompt!r} -> {text}")
    assert drafted > 0  # the replies were speculated, not only constrained


def test_json_object_and_refusals(served):
    import openai

    handle, client = served
    reply = client.chat.completions.create(
        model=handle.worker.model_id, temperature=0, max_tokens=120, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give the capital cities of France and Japan as JSON."}])
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    for bad, match in (({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/missing"}}}, "missing"),
                       ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
                       ({"type": "yaml"}, "yaml")):
        with pytest.raises(openai.BadRequestError, match=match):
            client.chat.completions.create(model=handle.worker.model_id, max_tokens=8, response_format=bad,
                                           messages=[{"role": "user", "content": "hi"}])
    # The server still answers after the refusals.
    ok = client.completions.create(model=handle.worker.model_id, prompt="The number", max_tokens=12, temperature=0,
                                   extra_body={"response_format": _format({"type": "integer"})})
    assert isinstance(json.loads(ok.choices[0].text), int)
