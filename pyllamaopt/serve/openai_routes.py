"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request

from fastapi.responses import StreamingResponse

from ..tokens import TokenLogprob
from .chat_answer import ChatRequest, answer_chat
from .chat_prompt import render_prompt
from .chat_messages import NO_PARAMETERS, Tool, ToolCall, ToolChoice, ToolResult, Turn, arguments_text, text_of
from .choices import ChoiceTally
from .errors import BadRequest, ServiceError
from .events import DoneEvent, Event, TokenEvent, Usage
from .logprob_shapes import CompletionLogprobs, TokenBytes, chat_content
from .reply_parser import ArgumentsPiece, CallStart, Piece, ReasoningPiece, TextPiece
from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, NamedToolChoice
from .service import Service
from .streaming import collect_choices, sse, started

router = APIRouter()

FINISH_REASONS = {"eos": "stop", "stop": "stop", "grammar": "stop", "length": "length", "context_full": "length",
                  "interrupted": "stop", "repeated_call": "tool_calls", "malformed_call": "stop"}


def error_body(exc: ServiceError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": exc.kind, "param": None, "code": None}}


def _usage(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def _ending(head: dict[str, Any], choice: dict[str, Any], done: DoneEvent, tally: ChoiceTally,
            include_usage: bool) -> list[dict[str, Any]]:
    """A choice's last chunk in a stream: its finish reason (with a JSON Schema, whether its output is
    valid; a chat reply's format); after the last choice's, (if the client asked) the usage of all."""
    fields = done.answer_fields()
    out = [{**head, "choices": [choice], **({"pyllamaopt": fields} if fields else {})}]
    if tally.add(done) and include_usage:
        out.append({**head, "choices": [], "usage": _usage(tally.usage), "pyllamaopt": tally.extension()})
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
    prompt = body.one_prompt()
    tokens = prompt if isinstance(prompt, list) else model.tokenize(prompt)
    params = body.generate_params(service.context.n_ctx)
    # echo: the prompt first; with logprobs, the prompt's own (Service.score), computed before the answer
    prompt_text = "" if not body.echo else prompt if isinstance(prompt, str) else model.detokenize(tokens)
    echoed, scored = (await service.score(tokens, params.logprobs) if body.echo and params.logprobs is not None
                      else (None, 0))
    events = await started(service.complete(tokens, params, n=body.n))
    rid, created, name = f"cmpl-{uuid.uuid4().hex}", int(time.time()), request.app.state.model_name
    head = {"id": rid, "object": "text_completion", "created": created, "model": name}
    tally = ChoiceTally(body.n)
    shape = None if params.logprobs is None else CompletionLogprobs(model.token_bytes)

    def logprobs(ids: list[int], values: Sequence[TokenLogprob | None]) -> dict[str, Any] | None:
        return None if shape is None else shape.lists(ids, values)

    def usage(done: DoneEvent) -> DoneEvent:  # the prompt's scoring computed tokens too (counted with choice 0)
        return done if done.index else replace(done, usage=replace(done.usage, computed=done.usage.computed + scored))

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunk(event: Event) -> list[dict[str, Any]]:
            if isinstance(event, TokenEvent):
                return [{**head, "choices": [{"index": event.index, "text": event.text, "finish_reason": None,
                                              "logprobs": logprobs([event.id], [event.logprob])}]}]
            return _ending(head, {"index": event.index, "text": "", "logprobs": None,
                                  "finish_reason": FINISH_REASONS[event.finish_reason]}, usage(event), tally,
                           include_usage)

        opening = [] if not body.echo else [{**head, "choices": [{
            "index": index, "text": prompt_text, "finish_reason": None,
            "logprobs": None if echoed is None else logprobs(tokens, echoed)}]} for index in range(body.n)]
        return sse(events, chunk, error_body, opening=opening)
    choices = []
    for ids, text, done in await collect_choices(events, request.receive):
        done = usage(done)
        tally.add(done)
        values = logprobs([*tokens, *ids], [*echoed, *done.logprobs]) if echoed is not None else \
            logprobs(ids, done.logprobs)
        choices.append({"index": done.index, "text": prompt_text + text, "logprobs": values,
                        "finish_reason": FINISH_REASONS[done.finish_reason]})
    return {**head, "choices": choices, "usage": _usage(tally.usage), "pyllamaopt": tally.extension()}


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
                                                                f"{where}.tool_calls[{j}].function.arguments"),
                          c.function.arguments if isinstance(c.function.arguments, str) else None)
                 for j, c in enumerate(m.tool_calls or [])]
        # OpenAI's 'developer' messages are its newer name for system messages
        turns.append(Turn("system" if m.role == "developer" else m.role, text_of(m.content, where), calls,
                          reasoning=m.reasoning_content or ""))
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
    if isinstance(piece, ReasoningPiece):  # (as llama-server and vLLM stream it)
        return {"reasoning_content": piece.text}
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
    """A chat completion's answer in OpenAI's shapes (chat_answer.ChatSurface); `token_bytes`: with
    log-probabilities asked for, how their tokens are spelled."""

    call_id_prefix = "call_"

    def __init__(self, model_name: str, include_usage: bool, n: int, token_bytes: TokenBytes | None) -> None:
        self.head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_name}
        self.include_usage = include_usage
        self.tally = ChoiceTally(n)
        self.token_bytes = token_bytes
        self.opened: set[int] = set()  # the choices whose first delta said the role
        self.unsent: dict[int, list[TokenLogprob]] = {}  # streamed, per choice: tokens whose text is held back yet

    def stream(self, events: AsyncGenerator[Event, None]) -> StreamingResponse:
        return sse(events, self.chunks, error_body)

    def _logprobs(self, values: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        if self.token_bytes is None:
            return None
        return {"content": chat_content(values, self.token_bytes), "refusal": None}

    def _streamed(self, index: int, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        """A streamed choice; it carries the log-probabilities of its tokens not sent yet."""
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish_reason}
        if self.token_bytes is not None:
            choice["logprobs"] = self._logprobs(self.unsent.pop(index, []))
        return choice

    def chunks(self, event: Event) -> list[dict[str, Any]]:
        c = {**self.head, "object": "chat.completion.chunk"}
        index, out = event.index, []
        if isinstance(event, TokenEvent) and event.logprob is not None:
            self.unsent.setdefault(index, []).append(event.logprob)
        for delta in filter(None, map(_delta, event.pieces)):  # at the end: what the parser held back
            if index not in self.opened and isinstance(event, TokenEvent):
                delta = {"role": "assistant", **delta}
                self.opened.add(index)
            out.append({**c, "choices": [self._streamed(index, delta, None)]})
        if isinstance(event, TokenEvent):
            return out
        delta = {} if index in self.opened else {"role": "assistant", "content": ""}
        return out + _ending(c, self._streamed(index, delta, _finish_reason(event)), event, self.tally,
                             self.include_usage)

    def whole(self, dones: Sequence[DoneEvent]) -> dict[str, Any]:
        for done in dones:
            self.tally.add(done)
        return {**self.head, "object": "chat.completion", "choices": [self._choice(done) for done in dones],
                "usage": _usage(self.tally.usage), "pyllamaopt": self.tally.extension()}

    def _choice(self, done: DoneEvent) -> dict[str, Any]:
        reply = done.reply
        assert reply is not None
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.calls:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in reply.calls]}
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        # several choices: each says its own fields (one: the answer's pyllamaopt says them)
        fields = {"pyllamaopt": done.answer_fields()} if self.tally.n > 1 else {}
        return {"index": done.index, "message": message, "finish_reason": _finish_reason(done),
                "logprobs": self._logprobs(done.logprobs), **fields}


def chat_request(body: ChatCompletionRequest, n_ctx: int) -> ChatRequest:
    """What the body asks, as rendering takes it (also the Ray gateway's, for routing by prefix)."""
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    # (its 400s come first, as they always did)
    params = replace(body.params(max_tokens, n_ctx, body.response_format), logprobs=body.alternatives())
    tools, choice = _tools(body)
    return ChatRequest(_turns(body.messages), tools, choice, params, n=body.n,
                       template_kwargs=body.chat_template_kwargs)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    service = _service(request)
    chat = chat_request(body, service.context.n_ctx)
    surface = _ChatCompletion(request.app.state.model_name,
                              bool(body.stream_options and body.stream_options.include_usage), body.n,
                              None if chat.params.logprobs is None else service.model.token_bytes)
    return await answer_chat(request, surface, chat, stream=bool(body.stream))


@router.post("/apply-template")
async def apply_template(body: ChatCompletionRequest, request: Request) -> dict[str, Any]:
    """llama-server's route: the prompt a chat completion of this body would compute, rendered and
    nothing generated (to compare a rendering with llama-server's). As llama-server shows it: for a
    model whose tokenizer adds BOS, without the template's BOS text (the same tokens either way)."""
    service = _service(request)
    model = service.model
    tools, choice = _tools(body)
    params = body.params(body.max_tokens, service.context.n_ctx, body.response_format)
    prompt = await asyncio.to_thread(render_prompt, request.app.state.chat_template, _turns(body.messages), tools,
                                     choice, params, template_kwargs=body.chat_template_kwargs)
    bos = model.detokenize([model.bos_token], special=True) if model.add_bos and model.bos_token >= 0 else ""
    return {"prompt": prompt.text[len(bos):] if bos and prompt.text.startswith(bos) else prompt.text}
