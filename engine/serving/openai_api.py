"""The routes: OpenAI's chat and text completions (streamed as SSE or not), models, health, metrics.

A request is validated and tokenized here, before it is queued, so that every bad request is
a 4xx with OpenAI's error body and never reaches the engine. Then it waits its turn on the
engine worker; a client that disconnects (streaming or not) cancels its job.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from dataclasses import dataclass

from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.core.events import Failed, Finished, Tokens
from engine.core.settings import DecodeSettings, OutputFormat
from engine.serving import metrics
from engine.serving.guard import require_json
from engine.serving.responses import ReplyShape, timings
from engine.tools.calls import StreamSplitter, call_grammar, marker_ids, template_writes_calls
from engine.serving.schemas import (ApiError, ChatCompletionRequest, CompletionRequest, GenerationFields,
                                    SpeculativeOptions, parse_body)
from engine.serving.worker import ServingWorker, GenerationRequest, Job, QueueFull

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 2**20
# A prompt of more characters than this per token of the context window is refused before it
# is tokenized: tokenizing 15 MB took ~8 s and ~2-3 GB only to count past the window. Real
# text runs 3-5 characters a token; only long runs of one repeated character pack more.
MAX_CHARS_PER_TOKEN = 16
_SEED_RANGE = 2**63  # torch generators take 64-bit seeds; OpenAI's may be any integer
# A temperature or top_p below this decodes greedily. Both tend to greedy decoding as they
# shrink (the most likely token alone), and sampling cannot take them: logits divided by a
# temperature of 1e-300 overflow float32, and a top_p under float32's range drops every token.
# vLLM treats temperatures below the same bound as greedy.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class ApiSettings:
    """The part of the server's configuration the routes read."""

    model_id: str
    api_key: str | None = None
    default_drafter: str = "model"
    default_max_tokens: int = 2048
    log_prompts: bool = False
    ping_seconds: float = 15.0  # SSE comment lines while a request waits: keeps proxies from timing out


class OpenAiApi:
    def __init__(self, worker: ServingWorker, settings: ApiSettings) -> None:
        self.worker = worker
        self.settings = settings
        self.registry = metrics.metrics_registry(worker, settings.model_id)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]

    # -- plain endpoints -------------------------------------------------------------------
    def _model_card(self) -> dict:
        return {"id": self.settings.model_id, "object": "model", "created": 0, "owned_by": "tandem",
                "max_model_len": self.worker.context_window, "draft_model": self.worker.has_draft_model()}

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        self._authorize(request)
        self._check_model(request.path_params["model"])
        return JSONResponse(self._model_card())

    async def health(self, request: Request) -> Response:
        c = self.worker.counters()
        return JSONResponse({"status": "ok", "model": self.settings.model_id, "in_flight": c.in_flight,
                             "queue_depth": c.queue_depth})

    async def metrics(self, request: Request) -> Response:
        self._authorize(request)
        return Response(metrics.render(self.registry), media_type=metrics.CONTENT_TYPE)

    # -- completions -----------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, chat: bool) -> Response:
        self._authorize(request)
        require_json(request)
        body = parse_body(await _read_body(request), ChatCompletionRequest if chat else CompletionRequest)
        self._check_model(body.model)
        prompt_ids, prompt_text = await run_in_threadpool(self._encode, body)
        generation = self._generation(body, prompt_ids, prompt_text)
        try:
            job = self.worker.submit(generation, asyncio.get_running_loop())
        except QueueFull as exc:
            raise ApiError(429, str(exc), type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(exc.retry_after_s)}) from None
        shape = ReplyShape(chat=chat, model=self.settings.model_id,
                           tools=frozenset(t["function"]["name"] for t in (body.tools_offered() if chat else None) or ()))
        if body.stream:
            return EventSourceResponse(self._stream(job, shape, body.include_usage()), ping=self.settings.ping_seconds)
        outcome = await _wait_unless_gone(job, request)
        if outcome is None:  # the client left; nobody reads this
            return Response(status_code=499)
        if isinstance(outcome, Failed):
            raise ApiError(500, f"generation failed: {outcome.error}", type="server_error", code="engine_error")
        return JSONResponse(shape.full(outcome, len(prompt_ids), self._timings(outcome, job)))

    async def _stream(self, job: Job, shape: ReplyShape, include_usage: bool):
        """SSE ``data:`` payloads; sse-starlette cancels this generator when the client goes away,
        and ``finally`` then cancels the job at the engine's next step."""
        splitter = StreamSplitter(shape.tools) if shape.tools else None
        try:
            if shape.chat:
                yield json.dumps(shape.role_chunk())
            async for event in job.events():
                if isinstance(event, Tokens) and event.text:
                    text = splitter.feed(event.text) if splitter is not None else event.text
                    if text:
                        yield json.dumps(shape.text_chunk(text))
                elif isinstance(event, Finished):
                    calls = ()
                    if splitter is not None:  # what was held back: text after all, or the calls
                        rest, calls = splitter.finish()
                        if rest:
                            yield json.dumps(shape.text_chunk(rest))
                        if calls:
                            yield json.dumps(shape.tool_calls_chunk(calls))
                    t = self._timings(event, job)
                    yield json.dumps(shape.finish_chunk(event, t, called=bool(calls)))
                    if include_usage:
                        yield json.dumps(shape.usage_chunk(event, len(job.request.prompt_ids), t))
                elif isinstance(event, Failed):
                    yield json.dumps(ApiError(500, f"generation failed: {event.error}", type="server_error",
                                              code="engine_error").body())
            yield "[DONE]"
        finally:
            job.cancel()  # a no-op once the job has finished

    def _timings(self, finished: Finished, job: Job) -> dict:
        return timings(finished, len(job.request.prompt_ids), job.request.drafter, job.queue_seconds)

    # -- validation ------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                           type="authentication_error", code="invalid_api_key")

    def _check_model(self, model: str | None) -> None:
        if model and model != self.settings.model_id:
            raise ApiError(404, f"the model {model!r} does not exist here; this server serves "
                                f"{self.settings.model_id!r} (GET /v1/models)",
                           type="not_found_error", param="model", code="model_not_found")

    def _encode(self, body: GenerationFields) -> tuple[list[int], str]:
        """Prompt ids, and the prompt's text for the log. Runs in a thread pool (tokenizing a long
        prompt would otherwise hold up the event loop)."""
        if isinstance(body, ChatCompletionRequest):
            messages = [m.for_template() for m in body.messages]
            tools = body.tools_offered()
            self._check_chars(sum(len(m["content"]) for m in messages) + len(json.dumps(tools or [])), "messages")
            if tools and not template_writes_calls(self.worker.chat_template):
                raise ApiError(400, "this model's chat template has no tool-call format Tandem reads (calls "
                                    "written as <tool_call> blocks: Qwen, Hermes); send the request without tools",
                               param="tools", code="unsupported_value")
            try:
                ids = self.worker.encode_chat(messages, tools)
            except Exception as exc:  # the chat template refused this conversation
                raise ApiError(400, f"the messages do not fit the model's chat template: {exc}",
                               param="messages", code="invalid_value") from None
            text, param = messages[-1]["content"], "messages"
        else:
            prompt = body.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, str):
                self._check_chars(len(prompt), "prompt")
                ids, text = (self.worker.encode_text(prompt) if prompt else []), prompt
            else:
                vocab = len(self.worker.session.tokenizer)
                if any(not 0 <= t < vocab for t in prompt):
                    raise ApiError(400, f"prompt token ids must be in [0, {vocab})", param="prompt", code="invalid_value")
                ids, text = list(prompt), f"<{len(prompt)} token ids>"
            param = "prompt"
        if not ids:
            raise ApiError(400, "the prompt is empty", param=param, code="invalid_value")
        window = self.worker.context_window
        if window and len(ids) >= window:
            raise ApiError(400, f"the prompt has {len(ids)} tokens but the model's context window is {window}; "
                                "shorten it", param=param, code="context_length_exceeded")
        return ids, text if self.settings.log_prompts else ""

    def _check_chars(self, chars: int, param: str) -> None:
        """Refuse a prompt too long for the window by its length alone, without tokenizing it."""
        window = self.worker.context_window
        if window and chars > window * MAX_CHARS_PER_TOKEN:
            raise ApiError(400, f"the prompt has {chars} characters, more than the model's context window of "
                                f"{window} tokens can hold; shorten it", param=param, code="context_length_exceeded")

    def _generation(self, body: GenerationFields, prompt_ids: list[int], prompt_text: str) -> GenerationRequest:
        window = self.worker.context_window
        requested = body.requested_max_tokens()
        if requested is not None and window and requested > window:
            raise ApiError(400, f"max_tokens is {requested} but the model's context window is {window} tokens",
                           param="max_tokens", code="invalid_value")
        max_new = requested or self.settings.default_max_tokens
        if window:  # the engine stops at the window's end too; this keeps the figure honest
            max_new = max(1, min(max_new, window - len(prompt_ids)))
        temperature = 1.0 if body.temperature is None else body.temperature  # OpenAI's default
        top_p = 1.0 if body.top_p is None else body.top_p
        if temperature < GREEDY_BELOW or top_p < GREEDY_BELOW:
            temperature = 0.0
        seed = secrets.randbits(63) if body.seed is None else body.seed % _SEED_RANGE
        spec = body.speculative or SpeculativeOptions()
        drafter = self._drafter(spec)
        try:
            settings = DecodeSettings(
                mode="greedy" if temperature == 0 else "sample", temperature=temperature or 1.0,
                top_k=body.top_k or 0, top_p=top_p, max_new_tokens=max_new,
                stop_strings=body.stop_strings(), seed=seed, draft_length=spec.draft_length,
                max_draft_length=spec.max_draft_length or 8, output_format=self._output_format(body),
            )
        except ValueError as exc:
            raise ApiError(400, str(exc), code="invalid_value") from None
        request_id = ("chatcmpl-" if isinstance(body, ChatCompletionRequest) else "cmpl-") + uuid.uuid4().hex[:12]
        return GenerationRequest(tuple(prompt_ids), settings, drafter, request_id, prompt_text)

    def _output_format(self, body: GenerationFields) -> OutputFormat | None:
        """The response_format's, or where tool_choice requires a call, a grammar of one call."""
        forced = body.forced_tool() if isinstance(body, ChatCompletionRequest) else None
        if forced is None:
            return body.output_format()
        ids = marker_ids(self.worker.session.tokenizer)
        return OutputFormat("lark", call_grammar(body.tools_offered(), forced[1], ids))

    def _drafter(self, spec: SpeculativeOptions) -> str:
        if not spec.enabled:
            return "off"
        kind = spec.drafter or self.settings.default_drafter
        if kind == "model" and not self.worker.has_draft_model():
            if spec.drafter == "model":
                raise ApiError(400, "no draft model is loaded: use drafter 'lookup' or 'mtp'",
                               param="speculative.drafter", code="invalid_value")
            return "lookup"  # the server's default, with nothing to draft with: prompt lookup
        return kind


async def _read_body(request: Request) -> bytes:
    """The body, refused past MAX_BODY_BYTES: far more text than any context window holds."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is over {MAX_BODY_BYTES // 2**20} MiB", code="request_too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ApiError(413, f"the request body is over {MAX_BODY_BYTES // 2**20} MiB",
                               code="request_too_large")
    except ClientDisconnect:  # gone before its body was in (or cut off for being slow): nobody reads a reply
        raise ApiError(400, "the client disconnected before sending the whole body", code="incomplete_body") from None
    return bytes(body)


async def _wait_unless_gone(job: Job, request: Request) -> Finished | Failed | None:
    """The job's result, or None (and the job cancelled) if the client disconnects first."""
    result = asyncio.ensure_future(job.result())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if result in done:
            return result.result()
        job.cancel()
        return None
    finally:
        for task in (result, gone):
            task.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def api_error_response(request: Request, exc: ApiError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def http_error_response(request: Request, exc: HTTPException) -> Response:
    """Starlette's own 404 / 405 in OpenAI's shape."""
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(ApiError(exc.status_code, str(exc.detail), type=kind).body(), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def internal_error_response(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error answering %s", request.url.path)
    return JSONResponse(ApiError(500, f"internal error: {type(exc).__name__}", type="server_error").body(),
                        status_code=500)
