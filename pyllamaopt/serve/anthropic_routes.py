"""Anthropic-compatible route: POST /v1/messages (streaming events and not, system blocks)."""
from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request

from ..errors import ChatTemplateError
from .schemas import MessagesRequest
from .service import BadRequest, Event, Service, ServiceError, TokenEvent, Usage
from .streaming import collect, sse, started

router = APIRouter()

STOP_REASONS = {"eos": "end_turn", "grammar": "end_turn", "interrupted": "end_turn", "stop": "stop_sequence",
                "length": "max_tokens", "context_full": "max_tokens"}


def error_body(exc: ServiceError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": exc.kind, "message": exc.message}}


def _text(content: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise BadRequest(f"{where}: content blocks must be of type 'text' (got {block.get('type')!r}): "
                             "this server takes text only")
        parts.append(block["text"])
    return "".join(parts)


def _usage(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.computed, "cache_read_input_tokens": usage.cached_tokens,
            "cache_creation_input_tokens": 0, "output_tokens": usage.completion_tokens}


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request) -> Any:
    service: Service = request.app.state.service
    if body.tools:
        raise BadRequest("tools are not supported by this server yet; send the request without 'tools'")
    chat = [{"role": "system", "content": _text(body.system, "system")}] if body.system else []
    chat += [{"role": m.role, "content": _text(m.content, f"messages.{i}")} for i, m in enumerate(body.messages)]
    try:
        prompt = request.app.state.chat_template.render(chat)
    except ChatTemplateError as exc:
        raise BadRequest(str(exc)) from None
    tokens = service.model.tokenize(prompt, add_bos=False, special=True)
    events = await started(service.complete(tokens, body.params(service.context.n_ctx)))
    message = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
               "model": request.app.state.model_name}
    if body.stream:
        def chunk(event: Event) -> list[dict[str, Any]]:
            if isinstance(event, TokenEvent):
                return [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": event.text}}]
            return [{"type": "content_block_stop", "index": 0},
                    {"type": "message_delta", "delta": {"stop_reason": STOP_REASONS[event.finish_reason],
                                                        "stop_sequence": event.stop_string},
                     "usage": _usage(event.usage), "pyllamaopt": event.usage.as_dict()},
                    {"type": "message_stop"}]

        opened = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
                  "usage": {"input_tokens": 0, "output_tokens": 0}}
        start: list[dict[str, Any]] = [
            {"type": "message_start", "message": opened},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
        return sse(events, chunk, error_body, done_line=False, named=True, prologue=start)
    _, text, done = await collect(events)
    return {**message, "content": [{"type": "text", "text": text}], "stop_reason": STOP_REASONS[done.finish_reason],
            "stop_sequence": done.stop_string,
            "usage": _usage(done.usage), "pyllamaopt": done.usage.as_dict()}
