"""A web page in the user's browser cannot drive the server: what a page can send (text/plain or
form POSTs, a foreign Origin, a rebound Host name) gets 403 / 415 in OpenAI's error shape, while
clients that are not browsers (the openai package, httpx, curl-like requests) work unchanged."""
import json

import pytest

from tests.engine.serving.client import assert_error, call

BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()


@pytest.fixture(scope="module")
def handle(tiny_session):
    from engine.serving.server import ServerConfig, run_in_thread

    with run_in_thread(tiny_session, ServerConfig(port=0, default_drafter="lookup")) as handle:
        yield handle


def post(url, content_type, body=BODY, path="/v1/chat/completions", **headers):
    return call(url, "POST", path, body, headers={"Content-Type": content_type, **headers}, timeout=30)


# The bodies a page may POST cross-origin without a CORS preflight, carrying JSON.
SIMPLE_BODIES = ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                 "multipart/form-data; boundary=x", "application/json; charset=latin-1", ""]


@pytest.mark.parametrize("content_type", SIMPLE_BODIES)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_body_not_declared_json_is_415(handle, content_type, path):
    body = BODY if path.endswith("chat/completions") else b'{"prompt": "hi", "max_tokens": 2}'
    error = assert_error(post(handle.url, content_type, body, path), 415)
    assert error["code"] == "unsupported_media_type"


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON;charset=\"UTF-8\""])
def test_json_with_or_without_a_utf8_charset_is_accepted(handle, content_type):
    assert post(handle.url, content_type).status == 200


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:3000",
                                    "http://127.0.0.1:1"])
def test_a_foreign_origin_is_403(handle, origin):
    for method, path, body in (("POST", "/v1/chat/completions", BODY), ("GET", "/v1/models", None),
                               ("GET", "/health", None), ("OPTIONS", "/v1/chat/completions", None)):
        error = assert_error(call(handle.url, method, path, body, headers={"Origin": origin}), 403)
        assert error["code"] == "origin_not_allowed"


def test_a_page_on_the_server_itself_is_same_origin(handle):
    own = {"Origin": f"http://127.0.0.1:{handle.port}"}
    assert post(handle.url, "application/json", **own).status == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}",
                                  "localhost.evil.example", "10.0.0.5:{port}"])
def test_a_rebound_host_name_is_403(handle, host):
    headers = {"Host": host.format(port=handle.port)}
    for method, path, body in (("POST", "/v1/chat/completions", BODY), ("GET", "/v1/models", None),
                               ("GET", "/health", None)):
        error = assert_error(call(handle.url, method, path, body, headers=headers), 403)
        assert error["code"] == "host_not_allowed"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:{port}", "localhost:{port}", "LOCALHOST.", "[::1]:{port}"])
def test_the_loopback_names_are_answered(handle, host):
    assert call(handle.url, "GET", "/v1/models", headers={"Host": host.format(port=handle.port)}).status == 200


def test_allowed_hosts_and_the_wildcard(tiny_session, start_server):
    url = start_server(tiny_session, allowed_hosts=("tandem.lan",)).url
    assert call(url, "GET", "/v1/models", headers={"Host": "tandem.lan:8080"}).status == 200
    assert_error(call(url, "GET", "/v1/models", headers={"Host": "other.lan"}), 403)
    url = start_server(tiny_session, allowed_hosts=("*",)).url
    assert call(url, "GET", "/v1/models", headers={"Host": "anything.example"}).status == 200


def test_a_cors_origin_is_let_through(tiny_session, start_server):
    url = start_server(tiny_session, cors_origins=("http://app.example",)).url
    reply = post(url, "application/json", Origin="http://app.example")
    assert reply.status == 200 and reply.headers["access-control-allow-origin"] == "http://app.example"
    assert_error(post(url, "application/json", Origin="http://evil.example"), 403)


def test_clients_that_are_not_browsers_work_unchanged(handle):
    import httpx2 as httpx
    import openai

    client = openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    assert [m.id for m in client.models.list()] == ["tiny-target"]
    reply = client.chat.completions.create(model="tiny-target", messages=[{"role": "user", "content": "a"}],
                                           max_tokens=2)
    assert reply.usage.completion_tokens >= 1
    stream = client.completions.create(model="tiny-target", prompt="a", max_tokens=2, stream=True)
    assert list(stream)
    assert httpx.post(handle.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=30).status_code == 200


def test_bound_to_every_address_ip_literals_are_answered_and_names_need_allowing():
    from engine.serving.guard import HostPolicy

    every = HostPolicy("0.0.0.0")
    assert every.allows_host("192.168.1.20:8080") and every.allows_host("[fe80::1]:8080")
    assert not every.allows_host("mybox.lan:8080")
    assert HostPolicy("0.0.0.0", ("mybox.lan",)).allows_host("MyBox.lan:8080")
    assert HostPolicy("192.168.1.20").allows_host("192.168.1.20:8080")
    assert not HostPolicy("192.168.1.20").allows_host("192.168.1.21:8080")
