"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""
from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from ..chat import ChatTemplate
from ..errors import ChatTemplateError
from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest
from .service import BadRequest, Event, Service, ServiceError, TokenEvent, Usage
from .streaming import collect, sse, started

router = APIRouter()

FINISH_REASONS = {"eos": "stop", "stop": "stop", "grammar": "stop", "length": "length", "context_full": "length",
                  "interrupted": "stop"}


def error_body(exc: ServiceError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": exc.kind, "param": None, "code": None}}


def _usage(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def _ending(head: dict[str, Any], choice: dict[str, Any], usage: Usage, include_usage: bool) -> list[dict[str, Any]]:
    """A stream's last chunks: the finish reason, then (if the client asked) the usage."""
    out = [{**head, "choices": [choice]}]
    if include_usage:
        out.append({**head, "choices": [], "usage": _usage(usage), "pyllamaopt": usage.as_dict()})
    return out


def _service(request: Request) -> Service:
    return request.app.state.service


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    name = request.app.state.model_name
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "pyllamaopt"}]}


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    service = _service(request)
    model = service.model
    tokens = body.prompt if isinstance(body.prompt, list) else model.tokenize(body.prompt)
    events = await started(service.complete(tokens, body.params(body.max_tokens, service.context.n_ctx)))
    rid, created, name = f"cmpl-{uuid.uuid4().hex}", int(time.time()), request.app.state.model_name
    head = {"id": rid, "object": "text_completion", "created": created, "model": name}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunk(event: Event) -> list[dict[str, Any]]:
            if isinstance(event, TokenEvent):
                return [{**head, "choices": [{"index": 0, "text": event.text, "logprobs": None, "finish_reason": None}]}]
            return _ending(head, {"index": 0, "text": "", "logprobs": None,
                                  "finish_reason": FINISH_REASONS[event.finish_reason]}, event.usage, include_usage)

        return sse(events, chunk, error_body)
    _, text, done = await collect(events)
    return {**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                 "finish_reason": FINISH_REASONS[done.finish_reason]}],
            "usage": _usage(done.usage), "pyllamaopt": done.usage.as_dict()}


def _text_of(message: ChatMessage) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    parts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise BadRequest(f"message content parts must be of type 'text' (got {part.get('type')!r}): "
                             "this server takes text only")
        parts.append(part["text"])
    return "".join(parts)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    service = _service(request)
    if body.tools:
        raise BadRequest("tools are not supported by this server yet; send the request without 'tools'")
    template: ChatTemplate = request.app.state.chat_template
    try:
        prompt = template.render([{"role": m.role, "content": _text_of(m)} for m in body.messages])
    except ChatTemplateError as exc:
        raise BadRequest(str(exc)) from None
    tokens = service.model.tokenize(prompt, add_bos=False, special=True)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params = body.params(max_tokens, service.context.n_ctx, body.response_format)
    events = await started(service.complete(tokens, params))
    rid, created, name = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), request.app.state.model_name
    head = {"id": rid, "created": created, "model": name}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        first = [True]

        def chunk(event: Event) -> list[dict[str, Any]]:
            c = {**head, "object": "chat.completion.chunk"}
            if isinstance(event, TokenEvent):
                delta = {"role": "assistant", "content": event.text} if first[0] else {"content": event.text}
                first[0] = False
                return [{**c, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}]
            delta = {"role": "assistant", "content": ""} if first[0] else {}
            return _ending(c, {"index": 0, "delta": delta, "finish_reason": FINISH_REASONS[event.finish_reason]},
                           event.usage, include_usage)

        return sse(events, chunk, error_body)
    _, text, done = await collect(events)
    return {**head, "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": FINISH_REASONS[done.finish_reason], "logprobs": None}],
            "usage": _usage(done.usage), "pyllamaopt": done.usage.as_dict()}
