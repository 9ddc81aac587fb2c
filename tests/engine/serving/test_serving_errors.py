"""Bad requests get a 4xx with OpenAI's error body ({"error": {message, type, param, code}}),
never a 500 and never a hung connection; the server keeps answering afterwards."""
import pytest

from tests.engine.serving.client import assert_error, call, chat
from tests.engine.serving.conftest import WINDOW

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def url(tiny_session):
    """One server for the whole table: a bad request must leave it as it was."""
    from engine.serving.server import ServerConfig, run_in_thread

    with run_in_thread(tiny_session, ServerConfig(port=0)) as handle:
        yield handle.url


def post(url, body, path="/v1/chat/completions"):
    return call(url, "POST", path, body, timeout=30)


BAD_CHAT = [
    ("invalid JSON", b'{"messages": [', 400, None),
    ("not an object", b'["messages"]', 400, None),
    ("empty body", b"", 400, None),
    ("missing messages", {"model": "tiny-target"}, 400, "messages"),
    ("empty messages", {"messages": []}, 400, "messages"),
    ("tool role", {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages.0.role"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ("missing role", {"messages": [{"content": "x"}]}, 400, "messages.0.role"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages.0.content"),
    ("number content", {"messages": [{"role": "user", "content": 3}]}, 400, "messages.0.content"),
    ("null content", {"messages": [{"role": "user", "content": None}]}, 400, "messages.0.content"),
    ("negative max_tokens", {"messages": USER, "max_tokens": -5}, 400, "max_tokens"),
    ("zero max_completion_tokens", {"messages": USER, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("huge max_tokens", {"messages": USER, "max_tokens": 10**9}, 400, "max_tokens"),
    ("string max_tokens", {"messages": USER, "max_tokens": "many"}, 400, "max_tokens"),
    ("n=2", {"messages": USER, "n": 2}, 400, "n"),
    ("temperature above 2", {"messages": USER, "temperature": 3}, 400, "temperature"),
    ("top_p zero", {"messages": USER, "top_p": 0}, 400, "top_p"),
    ("negative top_k", {"messages": USER, "top_k": -1}, 400, "top_k"),
    ("stop of numbers", {"messages": USER, "stop": [1, 2]}, 400, "stop"),
    ("logprobs", {"messages": USER, "logprobs": True}, 400, "logprobs"),
    ("tools", {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ("penalty", {"messages": USER, "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("unknown speculative field", {"messages": USER, "speculative": {"drafter": "model", "k": 3}}, 400,
     "speculative.k"),
    ("unknown drafter", {"messages": USER, "speculative": {"drafter": "oracle"}}, 400, "speculative.drafter"),
    ("draft_length too long", {"messages": USER, "speculative": {"draft_length": 99}}, 400,
     "speculative.draft_length"),
]


@pytest.mark.parametrize("name, body, status, param", BAD_CHAT, ids=[case[0] for case in BAD_CHAT])
def test_bad_chat_requests_get_an_openai_error(url, name, body, status, param):
    assert_error(post(url, body), status, param)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# Bodies that once reached Python code unprepared for them (a RecursionError, a tokenizer's
# TypeError) and were answered 500.
MALFORMED = [
    ("JSON nested 1,000 deep", b'{"messages": ' + nested(1000) + b"}", "/v1/chat/completions"),
    ("JSON nested past the parser's bound in an ignored field",
     b'{"messages": [{"role": "user", "content": "hi"}], "metadata": ' + nested(250) + b"}", "/v1/chat/completions"),
    ("lone surrogate in a prompt", b'{"prompt": "a\\ud800b", "max_tokens": 2}', "/v1/completions"),
    ("lone surrogate in a one-prompt list", b'{"prompt": ["\\udfff"], "max_tokens": 2}', "/v1/completions"),
    ("lone surrogate in a message", b'{"messages": [{"role": "user", "content": "a\\ud800"}]}', "/v1/chat/completions"),
    ("lone surrogate in a stop string", b'{"prompt": "a", "stop": ["\\ud800"]}', "/v1/completions"),
    ("bytes that are not UTF-8", b'{"prompt": "a\xff\xfe", "max_tokens": 2}', "/v1/completions"),
    ("NaN temperature", b'{"prompt": "a", "temperature": NaN}', "/v1/completions"),
]


@pytest.mark.parametrize("name, body, path", MALFORMED, ids=[case[0] for case in MALFORMED])
def test_malformed_bodies_are_400_not_500(url, name, body, path):
    error = assert_error(post(url, body, path), 400)
    assert error["code"] == "invalid_json"


@pytest.mark.parametrize("fields", [{"temperature": 1e-300}, {"top_p": 1e-300}, {"temperature": 5e-324, "top_p": 1e-300},
                                    {"temperature": 1e-6}], ids=str)
def test_a_vanishing_temperature_or_top_p_decodes_greedily(url, fields):
    """Their limit is the most likely token (greedy), which is how they are decoded: sampling
    with them would divide by zero in float32."""
    body = {"prompt": "def add(a, b):", "max_tokens": 6, "seed": 1}
    greedy = post(url, {**body, "temperature": 0}, "/v1/completions")
    reply = post(url, {**body, **fields}, "/v1/completions")
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_unknown_model_is_404(url):
    error = assert_error(post(url, {"model": "gpt-9", "messages": USER}), 404, "model")
    assert error["code"] == "model_not_found"
    assert_error(call(url, "GET", "/v1/models/gpt-9"), 404, "model")


def test_a_prompt_over_the_context_window_is_400(url):
    long_text = "def add(a, b):\n    return a + b\n" * WINDOW  # far more tokens than the window
    error = assert_error(post(url, {"messages": [{"role": "user", "content": long_text}]}), 400, "messages")
    assert error["code"] == "context_length_exceeded"
    error = assert_error(post(url, {"prompt": long_text}, "/v1/completions"), 400, "prompt")
    assert error["code"] == "context_length_exceeded"


BAD_COMPLETIONS = [
    ("missing prompt", {"max_tokens": 3}, "prompt"),
    ("empty prompt", {"prompt": ""}, "prompt"),
    ("two prompts", {"prompt": ["a", "b"]}, "prompt"),
    ("token id out of range", {"prompt": [1, 10**7]}, "prompt"),
    ("echo", {"prompt": "a", "echo": True}, "echo"),
    ("best_of", {"prompt": "a", "best_of": 3}, "best_of"),
]


@pytest.mark.parametrize("name, body, param", BAD_COMPLETIONS, ids=[case[0] for case in BAD_COMPLETIONS])
def test_bad_completion_requests_get_an_openai_error(url, name, body, param):
    assert_error(post(url, body, "/v1/completions"), 400, param)


def test_a_body_larger_than_any_context_is_413_before_it_is_read(url):
    from engine.serving.openai_api import MAX_BODY_BYTES

    # Only the header claims it: the server answers without waiting for the bytes.
    reply = call(url, "POST", "/v1/chat/completions", b"{}", headers={"Content-Length": str(MAX_BODY_BYTES + 1)})
    assert_error(reply, 413)


def test_unknown_routes_and_methods_answer_in_the_same_shape(url):
    assert_error(call(url, "GET", "/v1/embeddings"), 404)
    assert_error(call(url, "GET", "/v1/chat/completions"), 405)


def test_the_server_still_answers_after_bad_requests(tiny_session, start_server):
    handle = start_server(tiny_session)
    for _, body, _, _ in BAD_CHAT[:6]:
        post(handle.url, body)
    ok = chat(handle.url, max_tokens=3, temperature=0)
    assert ok.status == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    counters = handle.counters()
    assert counters.requests_failed == 0 and counters.requests_served == 1  # bad ones never reached the engine


def test_a_prompt_far_over_the_window_is_refused_before_it_is_tokenized(tiny_session, start_server, monkeypatch):
    """Tokenizing a 15 MB prompt took seconds and gigabytes only to refuse it; no token holds
    more than MAX_CHARS_PER_TOKEN characters in practice, so longer prompts are refused at once."""
    from engine.serving.openai_api import MAX_CHARS_PER_TOKEN

    handle = start_server(tiny_session)
    tokenized = []
    for name in ("encode_text", "encode_chat"):
        original = getattr(handle.worker, name)
        monkeypatch.setattr(handle.worker, name, lambda *a, _do=original, _name=name: tokenized.append(_name) or _do(*a))
    bound = WINDOW * MAX_CHARS_PER_TOKEN
    error = assert_error(post(handle.url, {"prompt": "x" * (bound + 1)}, "/v1/completions"), 400, "prompt")
    assert error["code"] == "context_length_exceeded"
    halves = [{"role": "user", "content": "x" * (bound // 2)}, {"role": "assistant", "content": "y" * (bound // 2 + 1)}]
    error = assert_error(post(handle.url, {"messages": halves}), 400, "messages")
    assert error["code"] == "context_length_exceeded"
    assert tokenized == []
    # At the bound the prompt is tokenized, and its token count decides.
    error = assert_error(post(handle.url, {"prompt": "x" * bound}, "/v1/completions"), 400, "prompt")
    assert error["code"] == "context_length_exceeded" and tokenized == ["encode_text"]
