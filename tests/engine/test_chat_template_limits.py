"""Chat templates render with limits (engine.gguf.chat_template), and real ones exactly as before.

A chat template is code that comes with the model file. Each hostile one here is refused
quickly, with one ``ChatTemplateRefused`` line naming the model, within little memory; the
hostile renders run in a child process whose address space is capped, so a template that
escaped the limits fails its test with a MemoryError or a timeout instead of taking the machine
down. Real templates (the default pair's, and templates shaped like the common families')
render byte for byte as transformers' own compile renders them.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine.gguf.chat_template import ChatTemplateRefused, compile_template, guard
from engine.gguf.template_budget import MAX_SECONDS

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
    root = Path(__file__).resolve().parents[2]
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
    from engine.models.loading import LoadedModel
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


# -- real templates: byte for byte as transformers renders them -------------------------------

# Written for these tests in the shape of the common families' templates: what they use
# (namespaces, tojson with indents, slices, string methods, raise_exception, loop controls,
# content parts, reasoning fields) matters here, not their exact text.
CHATML_REASONING = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- "# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string
          and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and reasoning_content %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}
                {%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
                {{- '<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' }}{{- content }}{{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""

LLAMA3_TOOLS = """\
{{- bos_token }}
{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, respond with a JSON function call.\\n\\n" }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

GEMMA = """\
{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}{%- set role = "model" -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}
"""

# {% generation %} marks what the assistant said (transformers' return_assistant_tokens_mask),
# rendered through Template.generate.
GENERATION = """\
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\\n' }}
    {%- if message.role == 'assistant' %}{% generation %}{{- message.content ~ '<|im_end|>' }}{% endgeneration %}
    {%- else %}{{- message.content ~ '<|im_end|>' }}{%- endif %}
    {{- '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, now. Uses \"quotes\" & <tags>.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web.",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
]
CONVERSATIONS = {
    "one user message": [{"role": "user", "content": "Write a haiku about rain."}],
    "system and turns": [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 'three' * 3? <b>&amp;</b> \"quoted\" \\ backslash"},
    ],
    "tool call and result": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Zürich? 東京 too 🙂"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear."},
        {"role": "user", "content": "Thanks!"},
    ],
    "reasoning": [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nDone.", "reasoning_content": "hmm"},
        {"role": "user", "content": "Again."},
    ],
    "content parts": [
        {"role": "system", "content": [{"type": "text", "text": "Be kind."}]},
        {"role": "user", "content": [{"type": "text", "text": " Describe "}, {"type": "text", "text": "this."}]},
    ],
    "long message": [{"role": "user", "content": "line of text\n" * 20_000}],
    "roles that do not alternate": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}
TEMPLATES = {"chatml-reasoning": CHATML_REASONING, "llama3-tools": LLAMA3_TOOLS, "gemma": GEMMA,
             "generation-marks": GENERATION}


def _default_pair_templates() -> dict[str, str]:
    """The default pair's templates, as the app reads them (the GGUF's tokenizer)."""
    from engine.core.paths import cache_dir
    from engine.gguf import metadata_cache
    from engine.models.default_pair import DRAFTER, TARGET
    from engine.testing.tiny_models import CHAT_TEMPLATE

    templates = {"tiny test tokenizer": CHAT_TEMPLATE}
    for spec in (TARGET, DRAFTER):
        path = cache_dir() / "gguf" / spec.filename
        if path.exists():
            templates[spec.name] = metadata_cache.tokenizer(*metadata_cache.open_cached(path)).chat_template
    return templates


@pytest.fixture(scope="module")
def tokenizer():
    from engine.testing.tiny_models import build_tokenizer

    tok = build_tokenizer()
    tok.bos_token = "<|endoftext|>"
    return guard(tok, "real.gguf")


def _render(tokenizer, bounded: bool, monkeypatch, **kwargs):
    """What apply_chat_template returns, or the error it raises, through the bounded compile or
    transformers' own."""
    from transformers.utils import chat_template_utils

    with monkeypatch.context() as patch:
        if not bounded:
            patch.setattr(chat_template_utils, "_compile_jinja_template",
                          chat_template_utils._cached_compile_jinja_template)
        try:
            return tokenizer.apply_chat_template(**kwargs)
        except Exception as exc:  # noqa: BLE001 (the same error either way is the point)
            return type(exc).__name__, str(exc)


def _cases():
    templates = {**_default_pair_templates(), **TEMPLATES}
    for name, template in templates.items():
        for conversation in CONVERSATIONS:
            yield pytest.param(template, conversation, id=f"{name}/{conversation}")


@pytest.mark.parametrize("template, conversation", list(_cases()))
def test_real_templates_render_as_transformers_renders_them(tokenizer, monkeypatch, template, conversation):
    for tools in (None, TOOLS):
        for add_generation_prompt in (False, True):
            kwargs = dict(conversation=CONVERSATIONS[conversation], chat_template=template, tools=tools,
                          add_generation_prompt=add_generation_prompt, tokenize=False, date_string="26 Jul 2024")
            ours, theirs = (_render(tokenizer, bounded, monkeypatch, **kwargs) for bounded in (True, False))
            assert ours == theirs
    if conversation == "one user message":  # the comparison is of renders, not of two equal errors
        assert isinstance(ours, str), ours


def test_assistant_masks_are_as_transformers_makes_them(tokenizer, monkeypatch):
    kwargs = dict(conversation=CONVERSATIONS["tool call and result"][4:] + CONVERSATIONS["system and turns"],
                  chat_template=GENERATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ours, theirs = (_render(tokenizer, bounded, monkeypatch, **kwargs) for bounded in (True, False))
    assert dict(ours) == dict(theirs) and sum(ours["assistant_masks"]) > 0


def test_transformers_compiles_chat_templates_with_limits():
    """install() replaced the one function transformers compiles chat templates with."""
    from transformers.utils import chat_template_utils

    assert chat_template_utils._compile_jinja_template is compile_template
    assert type(compile_template("{{ 1 }}")).__name__ == "BoundedTemplate"
