"""`tandem compare --remote` and `tandem models --remote` against real `tandem serve` servers
on loopback (speculation on / off)."""
from __future__ import annotations

from engine.cli import main
from tests.engine.remote.remote_servers import two_servers  # noqa: F401 (a fixture)


def test_models_remote_lists_the_servers_models(two_servers, capsys):
    on, _ = two_servers
    assert main(["models", "--remote", on.url]) == 0
    out = capsys.readouterr().out
    assert f"{on.url}/v1:" in out and "tiny-target" in out and "on the server" in out


def test_compare_races_two_endpoints(two_servers, capsys):
    on, off = two_servers
    assert main(["compare", "--remote", on.url, "--remote", off.url, "--max-new-tokens", "16", "Count."]) == 0
    out = capsys.readouterr().out
    assert out.count("16 tokens") == 2 and "tok/s after the first" in out
    assert "from timings" in out or "no drafts (timings)" in out
    assert "outputs: identical" in out


def test_compare_one_endpoint_with_and_without_its_speculation(two_servers, capsys):
    on, _ = two_servers
    assert main(["compare", "--remote", on.url, "--max-new-tokens", "12", "Count."]) == 0
    out = capsys.readouterr().out
    assert "(its speculation)" in out and "(speculative.enabled false)" in out
    assert "outputs: identical" in out


def test_bad_remote_arguments_are_refused_readably(capsys):
    assert main(["compare", "--remote", "gpu-box:8000", "Count."]) == 1
    assert "http://" in capsys.readouterr().err
    assert main(["compare", "--remote", "http://a", "--remote", "http://b", "--remote", "http://c", "x"]) == 1
