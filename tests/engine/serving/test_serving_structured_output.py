"""`tandem serve` follows ``response_format``: the official openai client asks the real default
pair (its GGUF target, as the app runs it) for JSON that follows a schema, streamed and not,
speculating; the replies parse, validate, and equal plain decoding's."""
import json

import jsonschema
import pytest

from engine.models.loading import default_pair
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


def _obj(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


_TEXT = {"type": "string", "maxLength": 40}
BOOK = _obj({"title": _TEXT, "author": _TEXT, "year": {"type": "integer", "minimum": 1400, "maximum": 2030},
             "genres": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3}})
RECIPE = _obj({"dish": _TEXT, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
               "ingredients": {"type": "array", "items": _obj({"name": {"type": "string", "maxLength": 24},
                                                                "grams": {"type": "integer", "minimum": 1, "maximum": 2000}}),
                               "minItems": 1, "maxItems": 4}})
EVENT = _obj({"name": _TEXT, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
              "city": {"type": "string", "maxLength": 30}, "online": {"type": "boolean"}})
PRODUCT = _obj({"name": _TEXT, "price_eur": {"type": "number", "minimum": 0, "maximum": 10000},
                "in_stock": {"type": "boolean"}, "color": {"enum": ["black", "white", "red", "blue", "green", "other"]}})
PLACE = _obj({"city": _TEXT, "country": _TEXT, "latitude": {"type": "number", "minimum": -90, "maximum": 90},
              "longitude": {"type": "number", "minimum": -180, "maximum": 180}})
HTTP = _obj({"status": {"enum": [200, 201, 301, 400, 401, 403, 404, 500, 503]}, "meaning": {"type": "string", "maxLength": 60},
             "retry": {"type": "boolean"}})
TASKS = _obj({"tasks": {"type": "array", "items": _obj({"title": _TEXT, "priority": {"enum": ["low", "medium", "high"]}}),
                        "minItems": 1, "maxItems": 4}})
#: Twenty requests a person might make of a local model for JSON: records, lists, numbers in
#: ranges, enums, patterns, nested objects.
TWENTY = [
    ("Describe Ada Lovelace as a person record.", PERSON),
    ("Invent a software engineer from Lisbon who writes Rust and Go.", PERSON),
    ("A person record for a retired teacher who speaks French.", PERSON),
    ("Describe a Python function that checks whether a string is a palindrome.", FUNCTION),
    ("Describe a function that returns the n-th Fibonacci number.", FUNCTION),
    ("Describe a function that tells whether a list is sorted.", FUNCTION),
    ("The novel 1984 as a book record.", BOOK),
    ("Recommend a fantasy book as a record.", BOOK),
    ("A recipe for pancakes.", RECIPE),
    ("A recipe for a tomato salad for two.", RECIPE),
    ("A Python conference in Berlin next spring, as an event.", EVENT),
    ("An online meetup about Rust on 2027-03-14.", EVENT),
    ("A blue mechanical keyboard for sale.", PRODUCT),
    ("A white coffee mug that is sold out.", PRODUCT),
    ("Where is Lisbon?", PLACE),
    ("Where is Tokyo?", PLACE),
    ("What does HTTP 404 mean?", HTTP),
    ("What does HTTP 503 mean, and should a client retry?", HTTP),
    ("Plan my morning: email, gym and a code review.", TASKS),
    ("The tasks to release a Python package.", TASKS),
]


def test_twenty_varied_schema_requests_validate_greedy_and_sampled_streamed_or_not(served):
    """Every one of 20 requests (half sampled at temperature 0.7, half streamed) gives JSON that
    parses and follows its schema."""
    handle, client = served
    for n, (prompt, schema) in enumerate(TWENTY):
        common = dict(model=handle.worker.model_id, messages=[{"role": "user", "content": prompt}], max_tokens=200,
                      response_format=_format(schema), temperature=0.7 if n % 2 else 0, seed=n, top_p=0.95)
        if n % 4 < 2:
            reply = client.chat.completions.create(**common)
            text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
        else:
            chunks = list(client.chat.completions.create(**common, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices and c.choices[0].finish_reason)
        assert finish == "stop", (prompt, text)
        jsonschema.validate(json.loads(text), schema)
        print(f"\n{'streamed' if n % 4 >= 2 else 'whole'}, T={common['temperature']}: {prompt!r} -> {text}")
