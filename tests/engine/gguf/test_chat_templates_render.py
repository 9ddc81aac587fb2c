"""Real chat templates (the default pair's, and templates shaped like the common families')
render under engine.gguf.chat_template's limits byte for byte as transformers' own compile
renders them."""
from __future__ import annotations

import pytest

from engine.gguf.chat_template import compile_template, guard

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
    from engine.models.loading.default_pair import DRAFTER, TARGET
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
