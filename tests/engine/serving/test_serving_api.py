"""The OpenAI endpoints on a real uvicorn server (tiny random pair): what comes back equals what
the engine decodes in-process, in OpenAI's shapes, with usage, timings and vLLM-named metrics."""
import json
import re

import pytest

from engine.core.settings import DecodeSettings
from engine.session.compare import drain
from tests.engine.serving.client import call, chat

PROMPT = "def add(a, b):"
GREEDY = {"temperature": 0, "max_tokens": 12}


def in_process(session, content, settings, drafter="model"):
    ids = session.encode([{"role": "user", "content": content}])
    return ids, drain(session.speculative(ids, settings, drafter))


def test_greedy_chat_equals_in_process_plain_and_speculative_decoding(tiny_session, start_server):
    ids, plain = in_process(tiny_session, PROMPT, DecodeSettings(max_new_tokens=12), drafter="off")
    _, spec = in_process(tiny_session, PROMPT, DecodeSettings(max_new_tokens=12, draft_length=3))
    assert plain.token_ids == spec.token_ids
    url = start_server(tiny_session).url
    reply = chat(url, PROMPT, **GREEDY, speculative={"draft_length": 3})
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny-target"
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": plain.text}
    assert choice["finish_reason"] == ("length" if len(plain.token_ids) == 12 else "stop")
    t = body["timings"]
    # The in-process runs left this prompt in a kept cache: all but its last token is reused.
    assert t["cache_n"] == len(ids) - 1
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(plain.token_ids),
                             "total_tokens": len(ids) + len(plain.token_ids),
                             "prompt_tokens_details": {"cached_tokens": len(ids) - 1}}
    assert t["prompt_n"] == 1 and t["predicted_n"] == len(plain.token_ids)
    assert t["draft_n"] == spec.stats.drafted > 0 and t["draft_n_accepted"] == spec.stats.accepted
    assert t["mean_accepted_length"] == pytest.approx(spec.stats.tokens_per_pass, abs=1e-3)
    for field in ("prompt_ms", "predicted_ms", "predicted_per_second"):
        assert t[field] >= 0


def test_streamed_chat_sends_role_text_finish_usage_then_done(tiny_session, start_server):
    _, plain = in_process(tiny_session, PROMPT, DecodeSettings(max_new_tokens=12), drafter="off")
    url = start_server(tiny_session).url
    reply = chat(url, PROMPT, **GREEDY, stream=True, stream_options={"include_usage": True})
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    data = reply.sse_data()
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
    assert text == plain.text
    finish, usage = chunks[-2], chunks[-1]
    assert finish["choices"][0]["finish_reason"] in ("stop", "length") and "timings" in finish
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(plain.token_ids)
    assert usage["timings"]["predicted_n"] == len(plain.token_ids)


def test_stream_without_include_usage_sends_no_usage_chunk(tiny_session, start_server):
    url = start_server(tiny_session).url
    chunks = [json.loads(d) for d in chat(url, PROMPT, **GREEDY, stream=True).sse_data()[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] is not None


def test_text_completion_streams_and_not_and_matches_raw_text_decoding(tiny_session, start_server):
    ids = tiny_session.encode(PROMPT, chat=False)
    plain = drain(tiny_session.plain(ids, DecodeSettings(max_new_tokens=10)))
    url = start_server(tiny_session).url
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": 10}
    full = call(url, "POST", "/v1/completions", body).json()
    assert full["object"] == "text_completion" and full["choices"][0]["text"] == plain.text
    assert full["usage"]["prompt_tokens"] == len(ids)
    streamed = call(url, "POST", "/v1/completions", {**body, "stream": True}).sse_data()
    assert streamed[-1] == "[DONE]"
    chunks = [json.loads(d) for d in streamed[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain.text
    # Token ids are a prompt too.
    by_ids = call(url, "POST", "/v1/completions", {**body, "prompt": ids}).json()
    assert by_ids["choices"][0]["text"] == plain.text


def test_the_official_openai_client_streams_and_sees_timings(tiny_session, start_server):
    from openai import OpenAI

    _, plain = in_process(tiny_session, PROMPT, DecodeSettings(max_new_tokens=12), drafter="off")
    url = start_server(tiny_session).url
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list()] == ["tiny-target"]
    stream = client.chat.completions.create(model="tiny-target", messages=[{"role": "user", "content": PROMPT}],
                                            temperature=0, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.text
    assert chunks[-1].usage.completion_tokens == len(plain.token_ids)
    assert chunks[-1].model_extra["timings"]["predicted_n"] == len(plain.token_ids)


def test_seeded_sampling_is_reproducible_and_equals_the_engine_with_that_seed(tiny_session, start_server):
    settings = DecodeSettings(mode="sample", temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_new_tokens=16,
                              draft_length=2)
    _, expected = in_process(tiny_session, PROMPT, settings)
    url = start_server(tiny_session).url
    fields = dict(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=16, speculative={"draft_length": 2})
    first, second = (chat(url, PROMPT, **fields).json() for _ in range(2))
    assert first["choices"][0]["message"]["content"] == expected.text
    assert second["choices"][0]["message"]["content"] == expected.text


def test_stop_strings_cut_the_reply_before_them(tiny_session, start_server):
    _, plain = in_process(tiny_session, PROMPT, DecodeSettings(max_new_tokens=24), drafter="off")
    stop = plain.text[5:8]
    assert len(stop) == 3 and stop in plain.text
    url = start_server(tiny_session).url
    for value in (stop, [stop, "never-in-the-text"]):
        body = chat(url, PROMPT, temperature=0, max_tokens=24, stop=value).json()
        assert body["choices"][0]["message"]["content"] == plain.text[: plain.text.index(stop)]
        assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("speculative, drafter", [({"enabled": False}, "off"), ({"drafter": "lookup"}, "lookup"),
                                                  ({"drafter": "model", "draft_length": 4}, "model")])
def test_the_speculative_field_picks_the_drafter_and_the_text_stays_the_same(tiny_session, start_server,
                                                                              speculative, drafter):
    _, plain = in_process(tiny_session, PROMPT, DecodeSettings(max_new_tokens=12), drafter="off")
    url = start_server(tiny_session).url
    body = chat(url, PROMPT, **GREEDY, speculative=speculative).json()
    assert body["choices"][0]["message"]["content"] == plain.text
    assert body["timings"]["drafter"] == drafter
    if drafter == "off":
        assert body["timings"]["draft_n"] == 0
    if drafter == "model":
        assert body["timings"]["draft_n"] > 0


def test_content_as_a_list_of_text_parts_equals_the_joined_string(tiny_session, start_server):
    url = start_server(tiny_session).url
    parts = [{"type": "text", "text": "def add"}, {"type": "text", "text": "(a, b):"}]
    as_parts = call(url, "POST", "/v1/chat/completions",
                    {"messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": parts}], **GREEDY}).json()
    as_string = call(url, "POST", "/v1/chat/completions",
                     {"messages": [{"role": "developer", "content": "Be brief."},  # OpenAI's new name for system
                                   {"role": "user", "content": "def add\n(a, b):"}], **GREEDY}).json()
    # The same prompt twice: the second request keeps all of it but its last token.
    assert as_parts["usage"]["prompt_tokens"] == as_string["usage"]["prompt_tokens"]
    assert as_string["usage"]["prompt_tokens_details"]["cached_tokens"] == as_string["usage"]["prompt_tokens"] - 1
    assert as_parts["choices"][0]["message"] == as_string["choices"][0]["message"]


def _metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf'^{re.escape(name)}\{{model_name="tiny-target"{re.escape(labels)}\}} (\S+)$', text, re.M)
    assert match, (name, labels, text)
    return float(match.group(1))


def test_models_health_and_metrics(tiny_session, start_server):
    handle = start_server(tiny_session)
    url = handle.url
    models = call(url, "GET", "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny-target"
    assert models["data"][0]["max_model_len"] == 4096
    assert call(url, "GET", "/v1/models/tiny-target").json()["id"] == "tiny-target"
    assert call(url, "GET", "/health").json()["status"] == "ok"
    body = chat(url, PROMPT, **GREEDY, speculative={"draft_length": 3}).json()
    reply = call(url, "GET", "/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain")
    text = reply.body.decode()
    drafted, accepted = body["timings"]["draft_n"], body["timings"]["draft_n_accepted"]
    assert _metric(text, "vllm:spec_decode_num_draft_tokens_total") == drafted
    assert _metric(text, "vllm:spec_decode_num_accepted_tokens_total") == accepted
    assert _metric(text, "vllm:spec_decode_num_drafts_total") == handle.counters().num_drafts > 0
    per_position = [_metric(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", f',position="{i}"')
                    for i in range(len(handle.counters().accepted_per_position))]
    assert sum(per_position) == accepted
    assert _metric(text, "vllm:generation_tokens_total") == body["usage"]["completion_tokens"]
    assert _metric(text, "vllm:prompt_tokens_total") == body["usage"]["prompt_tokens"]
    assert _metric(text, "vllm:num_requests_waiting") == 0
    assert _metric(text, "tandem:requests_total", ',outcome="served"') == 1
    assert _metric(text, "tandem:generation_tokens_per_second") > 0
