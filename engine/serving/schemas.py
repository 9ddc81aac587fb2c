"""Request bodies of the OpenAI API as Tandem accepts them, and the OpenAI error shape.

Unknown fields are ignored (clients send many), but fields that would change what a request
means and that Tandem does not implement (n > 1, logprobs, penalties, echo, ...) are refused
with a 400 rather than silently dropped. ``response_format`` (JSON object or schema) is
followed token by token (engine.decode.grammar); ``tools`` go to the chat template and come
back as calls (engine.tools.calls).
"""
from __future__ import annotations

import json
from typing import Any, Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.core.settings import MAX_DRAFT_LENGTH, InvalidRequest, OutputFormat
from engine.decode.grammar import check_output_format
from engine.tools.calls import arguments_for_template


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class FunctionCall(_Lenient):
    name: str
    arguments: str = "{}"


class AssistantToolCall(_Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Lenient):
    # "developer" is OpenAI's newer name for "system"; a "tool" turn is a tool's result.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[AssistantToolCall] | None = None  # an assistant turn's earlier calls
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value):
        # One clear message instead of one per branch of the union (images, audio, ...).
        if value is None or isinstance(value, str) or (isinstance(value, list) and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value)):
            return value
        raise ValueError("content must be a string or a list of {\"type\": \"text\", \"text\": ...} parts")

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    def for_template(self) -> dict:
        turn = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            # Chat templates write the arguments with tojson: they take them as a mapping.
            turn["tool_calls"] = [{"type": "function", "function": {"name": c.function.name,
                                                                    "arguments": arguments_for_template(c.function.arguments)}}
                                  for c in self.tool_calls]
        return turn


class FunctionSpec(_Lenient):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None


class Tool(_Lenient):
    type: Literal["function"]
    function: FunctionSpec


class StreamOptions(_Lenient):
    include_usage: bool = False


class SpeculativeOptions(BaseModel):
    """Tandem's own request field ``speculative``: off, or which drafter and how far it drafts.
    It never changes what the target accepts (lossless), only how fast the reply comes."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    drafter: Literal["model", "lookup", "mtp"] | None = None
    draft_length: int | None = Field(None, ge=0, le=MAX_DRAFT_LENGTH)
    max_draft_length: int | None = Field(None, ge=1, le=MAX_DRAFT_LENGTH)


class GenerationFields(_Lenient):
    """What chat and text completions share. None means "the default" (clients send nulls)."""

    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    speculative: SpeculativeOptions | None = None
    # OpenAI's structured output (chat); text completions take it too, as vLLM's do.
    response_format: dict | None = None

    def check_supported(self) -> None:
        if self.n not in (None, 1):
            raise ApiError(400, "only n=1 is supported: send one request per completion", param="n",
                           code="unsupported_value")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ApiError(400, f"{name} is not supported", param=name, code="unsupported_parameter")
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported", param="logit_bias", code="unsupported_parameter")
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise ApiError(400, "at most 16 stop strings", param="stop", code="invalid_value")
        self.output_format()  # refused here, before the prompt is read

    def output_format(self) -> OutputFormat | None:
        """``response_format`` as the engine's OutputFormat (None: plain text), or an ApiError
        naming what is wrong with it. Types: text, json_object, json_schema
        ({"json_schema": {"name": ..., "schema": {...}, "strict": ...}})."""
        spec = self.response_format
        if spec is None:
            return None
        kind = spec.get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            return OutputFormat("json_object")
        if kind != "json_schema":
            raise ApiError(400, f"response_format type must be 'text', 'json_object' or 'json_schema', not {kind!r}",
                           param="response_format.type", code="invalid_value")
        inner = spec.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format json_schema needs json_schema.schema, a JSON object",
                           param="response_format.json_schema.schema", code="invalid_value")
        text = json.dumps(schema)
        try:
            output = OutputFormat("json_schema", text)
            check_output_format(output)
        except InvalidRequest as exc:
            raise ApiError(400, str(exc), param="response_format.json_schema.schema", code="invalid_value") from None
        return output

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(GenerationFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs:
            raise ApiError(400, "logprobs are not supported", param="logprobs", code="unsupported_parameter")
        if self.functions:
            raise ApiError(400, "functions are not supported: send tools", param="functions",
                           code="unsupported_parameter")
        for i, message in enumerate(self.messages):
            if message.content is None and not (message.role == "assistant" and message.tool_calls):
                raise ApiError(400, "content may be null only in an assistant message with tool_calls",
                               param=f"messages.{i}.content", code="invalid_value")
            # As OpenAI: a tool's result answers a call the assistant made just before.
            before = self.messages[i - 1] if i else None
            if message.role == "tool" and not (before and (before.tool_calls or before.role == "tool")):
                raise ApiError(400, "a tool message must follow an assistant message with tool_calls",
                               param=f"messages.{i}.role", code="invalid_value")
        if self.tools and self.output_format() is not None:
            raise ApiError(400, "tools and a JSON response_format at once are not supported", param="response_format",
                           code="unsupported_value")
        self.forced_tool()

    def tools_offered(self) -> list[dict] | None:
        """The tools for the chat template (none where tool_choice is "none")."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def forced_tool(self) -> tuple[bool, str | None] | None:
        """None where the model may answer in text; else (True, the function's name or None for
        any of the tools) where tool_choice requires a call."""
        choice = self.tool_choice
        if not self.tools or choice in (None, "auto", "none"):
            return None
        if choice == "required":
            return True, None
        function = choice.get("function") if isinstance(choice, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise ApiError(400, "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                                "\"function\": {\"name\": ...}}", param="tool_choice", code="invalid_value")
        if name not in {t.function.name for t in self.tools}:
            raise ApiError(400, f"tool_choice names {name!r}, which is not one of the tools", param="tool_choice",
                           code="invalid_value")
        return True, name

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(GenerationFields):
    prompt: str | list[str] | list[int]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise ApiError(400, "one prompt per request: batched prompts are not supported", param="prompt",
                           code="unsupported_value")
        if self.echo:
            raise ApiError(400, "echo is not supported", param="echo", code="unsupported_parameter")
        if self.suffix:
            raise ApiError(400, "suffix is not supported", param="suffix", code="unsupported_parameter")
        if self.best_of not in (None, 1):
            raise ApiError(400, "only best_of=1 is supported", param="best_of", code="unsupported_value")
        if self.logprobs is not None:
            raise ApiError(400, "logprobs are not supported", param="logprobs", code="unsupported_parameter")

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


def parse_body(raw: bytes, model: type[GenerationFields]) -> GenerationFields:
    """The request body as ``model``, or an ApiError(400) that names the offending field.

    pydantic's own JSON parser (jiter) rather than the standard library's: it stops at 200
    levels of nesting without recursing on the Python stack (``json.loads`` raises
    RecursionError on a body of 1,000 brackets), refuses lone surrogates (a ``\\ud800``
    escape is no text: a tokenizer refuses it with a TypeError) and NaN / Infinity, which are
    not JSON."""
    try:
        data = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        raise _as_api_error(exc) from None
    request.check_supported()
    return request


def _as_api_error(exc: ValidationError) -> ApiError:
    # Union types report one error per alternative; the first names the field well enough.
    first = exc.errors(include_url=False)[0]
    loc = [str(part) for part in first["loc"]]
    # Drop pydantic's union-branch names (e.g. "str", "list[TextPart]") from the field path.
    path = [p for p in loc if not (p.startswith(("str", "list[", "int", "dict[")) or p in ("TextPart",))]
    param = ".".join(path) or None
    if first["type"] == "missing":
        message = f"missing required field: {param}"
    else:
        message = f"{param}: {first['msg']}" if param else first["msg"]
    return ApiError(400, message, param=param, code="invalid_value" if first["type"] != "missing" else "missing_field")
