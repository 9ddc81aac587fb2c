"""Chat templates render with limits (engine.gguf.chat_template), refusing hostile ones.

A chat template is code that comes with the model file. Each hostile one here is refused
quickly, with one ``ChatTemplateRefused`` line naming the model, within little memory; the
hostile renders run in a child process whose address space is capped, so a template that
escaped the limits fails its test with a MemoryError or a timeout instead of taking the machine
down.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from engine.gguf.chat_template import ChatTemplateRefused
from engine.gguf.template_budget import MAX_SECONDS
from tests.paths import REPO_ROOT

NAME = "hostile.gguf"
USER = [{"role": "user", "content": "hi"}]

HOSTILE = {
    "repetition": "{{ 'x' * 10**10 }}",
    "repetition in a loop": "{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}",
    "list repetition": "{{ ([messages] * 100000) * 100000 }}",
    "doubling with ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s }}",
    "~ in a loop": "{% set ns = namespace(s='') %}{% for i in range(100000) %}"
                   "{% set ns.s = ns.s ~ ('y' * 1000) %}{% endfor %}{{ ns.s }}",
    "nested range loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loops over messages": "{% for a in range(100000) %}{% for m in messages * 100 %}{{ m.role[:0] }}"
                           "{% endfor %}{% endfor %}",
    "recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "branching macro": "{% macro f(n) %}{% if n < 64 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}"
                       "{{ f(0) }}",
    "macro body in a loop": "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}"
                            "{% endmacro %}{{ m()|length }}",
    "% width": "{{ '%2000000000s' % 'x' }}",
    "% star width": "{{ '%*s' % (2000000000, 'x') }}",
    "format width": "{{ '{:>2000000000}'.format('x') }}",
    "format nested width": "{{ '{:>{w}}'.format('x', w=2000000000) }}",
    "format filter": "{{ '%*s'|format(2000000000, 'x') }}",
    "center": "{{ ''|center(10**10) }}",
    "ljust": "{{ 'x'.ljust(2000000000) }}",
    "indent": "{{ ('\\n' * 100000)|indent(100000) }}",
    "replace": "{{ ('x' * 1000000)|replace('x', 'y' * 1000) }}",
    "join": "{{ (range(100000)|list)|join('z' * 100000) }}",
    "huge number": "{{ 10 ** (10 ** 9) }}",
    "lipsum": "{{ lipsum(1000000) }}",
    "range over the limit": "{{ range(10**12)|length }}",
    "nested too deeply": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "an enormous template": "{{ messages }}" * 100_000,
}

# A child process renders every hostile template through a guarded tokenizer and reports each
# outcome, how long it took and how much its peak RSS grew, under an address-space cap of
# 2 GiB over what it holds after warming up.
_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from engine.gguf.chat_template import guard
    from engine.testing.tiny_models import build_tokenizer

    cases = json.loads(sys.stdin.read())
    tokenizer = guard(build_tokenizer(), sys.argv[1])
    tokenizer.apply_chat_template([{"role": "user", "content": "warm"}], tokenize=False)
    vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm + 2 * 2**30, resource.RLIM_INFINITY))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {}
    for name, template in cases.items():
        start = time.perf_counter()
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], chat_template=template,
                                                 tokenize=False)
            outcome = ("rendered", f"{len(text):,} characters")
        except BaseException as exc:
            outcome = (type(exc).__name__, str(exc))
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
        out[name] = [*outcome, time.perf_counter() - start, grown]
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def refusals() -> dict[str, list]:
    root = REPO_ROOT
    done = subprocess.run([sys.executable, "-c", _CHILD, NAME], input=json.dumps(HOSTILE), capture_output=True,
                          text=True, timeout=len(HOSTILE) * (MAX_SECONDS + 5), cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_template_is_refused_quickly_naming_the_model(refusals, case):
    kind, message, seconds, _ = refusals[case]
    assert kind == "ChatTemplateRefused", (kind, message[:300])
    assert message.startswith(f"{NAME}: its chat template ") and "\n" not in message, message
    assert seconds < MAX_SECONDS + 2, (seconds, message)


def test_hostile_templates_take_little_memory(refusals):
    # Unlimited, the first case alone asks for 10 GB and "repetition in a loop" for 100 GB.
    grown = {case: round(r[3]) for case, r in refusals.items()}
    assert max(grown.values()) < 300, grown


def test_a_gguf_files_template_is_refused_naming_the_file(tmp_path, monkeypatch):
    """The GGUF loader's tokenizer (engine.gguf.metadata_cache) names the file in a refusal."""
    from engine.gguf import metadata_cache
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    tokenizer = build_tokenizer()
    tokenizer.chat_template = HOSTILE["nested range loops"]
    path = write_gguf(build_model("qwen2", len(tokenizer)), tokenizer, tmp_path / NAME, "Q8_0")
    for _ in range(2):  # converted from the metadata, then the cache entry's saved copy
        file, folder = metadata_cache.open_cached(path)
        loaded = metadata_cache.tokenizer(file, folder)
        with pytest.raises(ChatTemplateRefused, match=rf"^{NAME}: its chat template ran over"):
            loaded.apply_chat_template(USER, tokenize=False)


@pytest.fixture(scope="module")
def hostile_session():
    from engine.models.loading.loader import LoadedModel
    from engine.session.session import Session
    from engine.testing.tiny_models import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = HOSTILE["repetition in a loop"]
    model = build_model(len(tokenizer), layers=1)
    return Session(LoadedModel("hostile-model", model, tokenizer, torch.device("cpu"), torch.float32, 0.0))


def test_a_session_refuses_naming_its_model(hostile_session):
    with pytest.raises(ChatTemplateRefused, match=r"^hostile-model: its chat template exceeded 4 MB of text"):
        hostile_session.encode("hi")


def test_the_server_answers_a_refused_template_with_a_json_error(hostile_session):
    from engine.serving.server import ServerConfig, run_in_thread
    from tests.engine.serving.client import call

    with run_in_thread(hostile_session, ServerConfig(port=0)) as handle:
        reply = call(handle.url, "POST", "/v1/chat/completions", {"messages": USER}, timeout=60)
        assert reply.status == 400, reply.body[:500]
        error = reply.json()["error"]
        assert "hostile-model: its chat template exceeded" in error["message"], error
        assert call(handle.url, "GET", "/health").status == 200
