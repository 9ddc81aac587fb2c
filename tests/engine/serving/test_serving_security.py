"""Safe by default: loopback only, remote binding needs --allow-remote and a key, a key guards
every /v1 endpoint and /metrics, no CORS unless asked, no prompts in the logs unless asked."""
import logging

import pytest

from engine.cli import main
from engine.serving.server import ServerConfig, is_loopback
from tests.engine.serving.client import assert_error, call, chat

KEY = "sk-local-test-key"


@pytest.mark.parametrize("host, allowed", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                           ("127.0.0.2", True), ("0.0.0.0", False), ("192.168.1.20", False)])
def test_loopback_hosts(host, allowed):
    assert is_loopback(host) == allowed


def test_binding_beyond_loopback_needs_allow_remote_and_a_key():
    with pytest.raises(ValueError, match="--allow-remote"):
        ServerConfig(host="0.0.0.0").check()
    with pytest.raises(ValueError, match="API key"):
        ServerConfig(host="0.0.0.0", allow_remote=True).check()
    ServerConfig(host="0.0.0.0", allow_remote=True, api_key=KEY).check()
    ServerConfig().check()  # loopback, no key: fine


def test_the_cli_refuses_to_start_on_a_public_address_before_loading_anything(capsys):
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 1
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--allow-remote"]) == 1
    assert "API key" in capsys.readouterr().err


def test_with_a_key_every_v1_endpoint_and_metrics_need_it(tiny_session, start_server):
    url = start_server(tiny_session, api_key=KEY).url
    good = {"Authorization": f"Bearer {KEY}"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        for method, path, body in (("GET", "/v1/models", None), ("GET", "/v1/models/tiny-target", None),
                                   ("GET", "/metrics", None),
                                   ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}),
                                   ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]})):
            error = assert_error(call(url, method, path, body, headers=headers), 401)
            assert error["code"] == "invalid_api_key"
    assert call(url, "GET", "/health").status == 200  # liveness stays open, and says nothing private
    assert call(url, "GET", "/v1/models", headers=good).status == 200
    assert call(url, "GET", "/metrics", headers=good).status == 200
    assert chat(url, max_tokens=2, headers=good).status == 200


def test_the_openai_client_with_and_without_the_key(tiny_session, start_server):
    import openai

    url = start_server(tiny_session, api_key=KEY).url + "/v1"
    ok = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=30)
    reply = ok.chat.completions.create(model="tiny-target", messages=[{"role": "user", "content": "a"}], max_tokens=2)
    assert reply.usage.completion_tokens >= 1
    wrong = openai.OpenAI(base_url=url, api_key="nope", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_no_cors_headers_unless_an_origin_is_allowed(tiny_session, start_server):
    origin = {"Origin": "http://evil.example"}
    url = start_server(tiny_session).url
    assert "access-control-allow-origin" not in call(url, "GET", "/v1/models", headers=origin).headers
    preflight = {**origin, "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in call(url, "OPTIONS", "/v1/chat/completions", headers=preflight).headers

    url = start_server(tiny_session, cors_origins=("http://app.example",)).url
    allowed = call(url, "GET", "/v1/models", headers={"Origin": "http://app.example"})
    assert allowed.headers["access-control-allow-origin"] == "http://app.example"
    assert "access-control-allow-origin" not in call(url, "GET", "/v1/models", headers=origin).headers
    ok = call(url, "OPTIONS", "/v1/chat/completions",
              headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"})
    assert ok.status == 200 and ok.headers["access-control-allow-origin"] == "http://app.example"


@pytest.mark.parametrize("log_prompts", [False, True])
def test_prompts_stay_out_of_the_logs_unless_asked(tiny_session, start_server, caplog, log_prompts):
    caplog.set_level(logging.DEBUG)
    url = start_server(tiny_session, log_prompts=log_prompts).url
    assert chat(url, "a secret plan for Tuesday", max_tokens=2).status == 200
    assert call(url, "POST", "/v1/completions", {"prompt": "another secret", "max_tokens": 2}).status == 200
    request_lines = [r for r in caplog.records if r.name.startswith("engine.serving")]
    assert len(request_lines) >= 2  # the requests were logged...
    for secret in ("a secret plan for Tuesday", "another secret"):
        assert (secret in caplog.text) == log_prompts  # ...their prompts only when asked
