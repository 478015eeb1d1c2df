"""Anthropic-compatible routes: POST /v1/messages (streaming events and not, system blocks, tools) and
POST /v1/messages/count_tokens."""
from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import jiter
from fastapi import APIRouter, Request

from fastapi.responses import StreamingResponse

from .chat_answer import ChatRequest, answer_chat, render_chat
from .chat_messages import ChoiceMode, Tool, ToolCall, ToolChoice, ToolResult, Turn, arguments_text, text_of
from .errors import BadRequest, ServiceError
from .events import DoneEvent, Event, TokenEvent, Usage
from .params import GenerateParams
from .reply_parser import ArgumentsPiece, CallEnd, CallStart, Piece, ReasoningPiece, TextPiece
from .schemas import AnthropicMessage, CountTokensRequest, MessagesRequest
from .service import Service
from .streaming import sse

router = APIRouter()

_MODES: dict[str, ChoiceMode] = {"auto": "auto", "any": "required", "none": "none"}  # of tool_choice.type
STOP_REASONS = {"eos": "end_turn", "grammar": "end_turn", "interrupted": "end_turn", "stop": "stop_sequence",
                "length": "max_tokens", "context_full": "max_tokens", "repeated_call": "tool_use",
                "malformed_call": "end_turn"}


def error_body(exc: ServiceError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": exc.kind, "message": exc.message}}


def _turn(m: AnthropicMessage, where: str) -> Turn:
    if isinstance(m.content, str):
        return Turn(m.role, m.content)
    turn = Turn(m.role)
    for j, block in enumerate(m.content):
        at, kind = f"{where}.content[{j}]", block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            turn.text += block["text"]
        elif kind == "tool_use" and m.role == "assistant":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
                raise BadRequest(f"{at}: a tool_use block needs 'id' and 'name' (strings) and 'input' (an object)")
            turn.calls.append(ToolCall(call_id, name, arguments_text(arguments, f"{at}.input")))
        elif kind == "thinking" and m.role == "assistant" and isinstance(block.get("thinking"), str):
            turn.reasoning += block["thinking"]  # (rendered as the template renders reasoning: most drop it)
        elif kind == "redacted_thinking" and m.role == "assistant":
            continue  # (none of ours: its text is not known)
        elif kind == "tool_result" and m.role == "user":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise BadRequest(f"{at}: a tool_result block needs 'tool_use_id' (a string)")
            turn.results.append(ToolResult(call_id, text_of(block.get("content"), f"{at}.content"),
                                           block.get("is_error") is True))
        else:
            raise BadRequest(f"{at}: a content block of type {kind!r} is not taken here: this server takes text, "
                             "tool_use (in assistant messages) and tool_result (in user messages)")
    return turn


def _turns(body: CountTokensRequest) -> list[Turn]:
    turns = [Turn("system", text_of(body.system, "system"))] if body.system else []
    return turns + [_turn(m, f"messages[{i}]") for i, m in enumerate(body.messages)]


def _tools(body: CountTokensRequest) -> tuple[list[Tool], ToolChoice]:
    tools = []
    for i, t in enumerate(body.tools or []):
        if t.type not in (None, "custom"):
            raise BadRequest(f"tools[{i}] ({t.name}): type {t.type!r} is one of Anthropic's server tools, which this "
                             "server does not run; give custom tools (name, description, input_schema)")
        if t.input_schema is None:
            raise BadRequest(f"tools[{i}] ({t.name}): input_schema is required")
        tools.append(Tool(t.name, t.description, t.input_schema))
    c = body.tool_choice
    if c is None:
        return tools, ToolChoice()
    parallel = not c.disable_parallel_tool_use
    if c.type == "tool":
        if not c.name:
            raise BadRequest("tool_choice of type 'tool' needs the tool's 'name'")
        return tools, ToolChoice("required", c.name, parallel)
    return tools, ToolChoice(_MODES[c.type], None, parallel)


def _usage(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.computed, "cache_read_input_tokens": usage.cached_tokens,
            "cache_creation_input_tokens": 0, "output_tokens": usage.completion_tokens}


def _stop_reason(done: DoneEvent) -> str:
    reply = done.reply
    return "tool_use" if reply is not None and reply.called_tools else STOP_REASONS[done.finish_reason]


def _input(call: ToolCall) -> Any:
    """A call's arguments as an object; cut by max_tokens, what its partial JSON holds, read as the
    anthropic SDK reads a streamed call's (jiter's partial mode: an unfinished string or key left
    out), so that streaming and not give the same input."""
    try:
        return json.loads(call.arguments)
    except json.JSONDecodeError:
        try:
            value = jiter.from_json(call.arguments.encode(), partial_mode=True)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


class _Blocks:
    """The content-block events of a streamed reply: a block opens when its first piece comes."""

    def __init__(self) -> None:
        self.count = 0
        self.open: str | None = None  # the kind of the last block, while open

    def events(self, piece: Piece) -> list[dict[str, Any]]:
        if isinstance(piece, TextPiece):
            out = [] if self.open == "text" else self.start({"type": "text", "text": ""})
            return out + [self.delta({"type": "text_delta", "text": piece.text})]
        if isinstance(piece, ReasoningPiece):  # (no signature: the thinking is not Anthropic's to sign)
            out = [] if self.open == "thinking" else self.start({"type": "thinking", "thinking": "", "signature": ""})
            return out + [self.delta({"type": "thinking_delta", "thinking": piece.text})]
        if isinstance(piece, CallStart):
            return self.start({"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}})
        if isinstance(piece, ArgumentsPiece):
            return [self.delta({"type": "input_json_delta", "partial_json": piece.text})]
        assert isinstance(piece, CallEnd)
        return self.stop()

    def start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self.stop()
        self.open, self.count = block["type"], self.count + 1
        return out + [{"type": "content_block_start", "index": self.count - 1, "content_block": block}]

    def delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.count - 1, "delta": delta}

    def stop(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.count - 1}]

    def end(self) -> list[dict[str, Any]]:
        """The last block closed (an empty text block if there was none)."""
        return (self.stop() if self.count else self.start({"type": "text", "text": ""})) + self.stop()


class _Message:
    """A message's answer in Anthropic's shapes (chat_answer.ChatSurface)."""

    call_id_prefix = "toolu_"

    def __init__(self, model_name: str) -> None:
        self.message: dict[str, Any] = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model_name}
        self.blocks = _Blocks()
        self.opened = False  # a stream: message_start sent

    def stream(self, events: AsyncGenerator[Event, None]) -> StreamingResponse:
        return sse(events, self.events, error_body, done_line=False, named=True)

    def events(self, event: Event) -> list[dict[str, Any]]:
        # the first event opens the message: the prompt was computed (or restored) before it, so its
        # usage splits the prompt into input_tokens and cache_read_input_tokens as Anthropic's does
        # (message_delta says the same split at the end, with the output tokens)
        out: list[dict[str, Any]] = []
        if not self.opened:
            self.opened = True
            assert event.usage is not None, "the first token carries the prompt's usage"
            out.append({"type": "message_start", "message": {
                **self.message, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": _usage(event.usage)}})
        # at the end, first what the parser held back (ReplyParser.finish)
        out += [e for piece in event.pieces for e in self.blocks.events(piece)]
        if isinstance(event, TokenEvent):
            return out
        return out + self.blocks.end() + [
            {"type": "message_delta", "delta": {"stop_reason": _stop_reason(event), "stop_sequence": event.stop_string},
             "usage": _usage(event.usage), "pyllamaopt": event.extension()},
            {"type": "message_stop"}]

    def whole(self, dones: Sequence[DoneEvent]) -> dict[str, Any]:
        (done,) = dones  # (Anthropic's API has one choice)
        reply = done.reply
        assert reply is not None
        content: list[dict[str, Any]] = ([{"type": "thinking", "thinking": reply.reasoning, "signature": ""}]
                                         if reply.reasoning else [])
        content += [{"type": "text", "text": reply.text}] if reply.text or not reply.calls else []
        content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)} for c in reply.calls]
        return {**self.message, "content": content, "stop_reason": _stop_reason(done), "stop_sequence": done.stop_string,
                "usage": _usage(done.usage), "pyllamaopt": done.extension()}


def chat_request(body: CountTokensRequest, n_ctx: int) -> ChatRequest:
    """What the body asks, as rendering takes it (also the Ray gateway's, for routing by prefix)."""
    params = body.params(n_ctx) if isinstance(body, MessagesRequest) else GenerateParams()
    tools, choice = _tools(body)
    return ChatRequest(_turns(body), tools, choice, params, continue_last=True,
                       template_kwargs=body.template_kwargs())


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request) -> Any:
    service: Service = request.app.state.service
    return await answer_chat(request, _Message(request.app.state.model_name),
                             chat_request(body, service.context.n_ctx), stream=bool(body.stream))


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, Any]:
    """The prompt's tokens as /v1/messages renders them (tools and the generic format included)."""
    service: Service = request.app.state.service
    _, tokens, _ = await render_chat(request.app.state.chat_template, service.model,
                                     chat_request(body, service.context.n_ctx))
    return {"input_tokens": len(tokens)}
