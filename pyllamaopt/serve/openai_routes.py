"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Request

from fastapi.responses import StreamingResponse

from .chat_answer import ChatRequest, answer_chat
from .chat_messages import NO_PARAMETERS, Tool, ToolCall, ToolChoice, ToolResult, Turn, arguments_text, text_of
from .errors import BadRequest, ServiceError
from .events import DoneEvent, Event, TokenEvent, Usage
from .reply_parser import ArgumentsPiece, CallStart, Piece, TextPiece
from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, NamedToolChoice
from .service import Service
from .streaming import collect, sse, started

router = APIRouter()

FINISH_REASONS = {"eos": "stop", "stop": "stop", "grammar": "stop", "length": "length", "context_full": "length",
                  "interrupted": "stop", "repeated_call": "tool_calls"}


def error_body(exc: ServiceError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": exc.kind, "param": None, "code": None}}


def _usage(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def _ending(head: dict[str, Any], choice: dict[str, Any], done: DoneEvent, include_usage: bool) -> list[dict[str, Any]]:
    """A stream's last chunks: the finish reason (with a JSON Schema, whether the output is valid),
    then (if the client asked) the usage."""
    out = [{**head, "choices": [choice], **({"pyllamaopt": done.schema_fields()} if done.schema else {})}]
    if include_usage:
        out.append({**head, "choices": [], "usage": _usage(done.usage), "pyllamaopt": done.extension()})
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
                                  "finish_reason": FINISH_REASONS[event.finish_reason]}, event, include_usage)

        return sse(events, chunk, error_body)
    _, text, done = await collect(events, request.receive)
    return {**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                 "finish_reason": FINISH_REASONS[done.finish_reason]}],
            "usage": _usage(done.usage), "pyllamaopt": done.extension()}


def _turns(messages: list[ChatMessage]) -> list[Turn]:
    turns = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.role == "tool":
            if not m.tool_call_id:
                raise BadRequest(f"{where}: a tool message needs the 'tool_call_id' of the call it answers")
            turns.append(Turn("user", results=[ToolResult(m.tool_call_id, text_of(m.content, where))]))
            continue
        if m.tool_calls and m.role != "assistant":
            raise BadRequest(f"{where}: only assistant messages carry tool_calls")
        calls = [ToolCall(c.id, c.function.name, arguments_text(c.function.arguments,
                                                                f"{where}.tool_calls[{j}].function.arguments"))
                 for j, c in enumerate(m.tool_calls or [])]
        # OpenAI's 'developer' messages are its newer name for system messages
        turns.append(Turn("system" if m.role == "developer" else m.role, text_of(m.content, where), calls))
    return turns


def _tools(body: ChatCompletionRequest) -> tuple[list[Tool], ToolChoice]:
    # no parameters: OpenAI's "empty parameter list" (not "any object")
    tools = [Tool(t.function.name, t.function.description,
                  NO_PARAMETERS if t.function.parameters is None else t.function.parameters) for t in body.tools or []]
    parallel = body.parallel_tool_calls is not False
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        return tools, ToolChoice("required", choice.function.name, parallel)
    return tools, ToolChoice(choice or "auto", None, parallel)


def _delta(piece: Piece) -> dict[str, Any] | None:
    if isinstance(piece, TextPiece):
        return {"content": piece.text}
    if isinstance(piece, CallStart):
        return {"tool_calls": [{"index": piece.index, "id": piece.id, "type": "function",
                                "function": {"name": piece.name, "arguments": ""}}]}
    if isinstance(piece, ArgumentsPiece):
        return {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]}
    return None  # a call's end: OpenAI's stream does not mark it


def _finish_reason(done: DoneEvent) -> str:
    reply = done.reply
    return "tool_calls" if reply is not None and reply.called_tools else FINISH_REASONS[done.finish_reason]


class _ChatCompletion:
    """A chat completion's answer in OpenAI's shapes (chat_answer.ChatSurface)."""

    call_id_prefix = "call_"

    def __init__(self, model_name: str, include_usage: bool) -> None:
        self.head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_name}
        self.include_usage = include_usage
        self.first = True  # the first delta also says the role

    def stream(self, events: AsyncGenerator[Event, None]) -> StreamingResponse:
        return sse(events, self.chunks, error_body)

    def chunks(self, event: Event) -> list[dict[str, Any]]:
        c = {**self.head, "object": "chat.completion.chunk"}
        out = []
        for delta in filter(None, map(_delta, event.pieces)):  # at the end: what the parser held back
            if self.first and isinstance(event, TokenEvent):
                delta, self.first = {"role": "assistant", **delta}, False
            out.append({**c, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        if isinstance(event, TokenEvent):
            return out
        delta = {"role": "assistant", "content": ""} if self.first else {}
        return out + _ending(c, {"index": 0, "delta": delta, "finish_reason": _finish_reason(event)}, event,
                             self.include_usage)

    def whole(self, done: DoneEvent) -> dict[str, Any]:
        reply = done.reply
        assert reply is not None
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.calls:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in reply.calls]}
        return {**self.head, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(done), "logprobs": None}],
                "usage": _usage(done.usage), "pyllamaopt": done.extension()}


def chat_request(body: ChatCompletionRequest, n_ctx: int) -> ChatRequest:
    """What the body asks, as rendering takes it (also the Ray gateway's, for routing by prefix)."""
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params = body.params(max_tokens, n_ctx, body.response_format)  # (its 400s come first, as they always did)
    tools, choice = _tools(body)
    return ChatRequest(_turns(body.messages), tools, choice, params)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    surface = _ChatCompletion(request.app.state.model_name,
                              bool(body.stream_options and body.stream_options.include_usage))
    return await answer_chat(request, surface, chat_request(body, _service(request).context.n_ctx),
                             stream=bool(body.stream))
