"""What both chat surfaces (OpenAI's /v1/chat/completions, Anthropic's /v1/messages) do with a
request, written once: render the prompt, complete it (the service parses the reply as it streams,
and its events carry the parse), then answer, streamed as server-sent events or whole. A surface
only shapes the payloads (ChatSurface)."""
from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..chat import ChatTemplate
from ..model import Model
from .chat_messages import Tool, ToolChoice, Turn
from .chat_prompt import ChatPrompt, render_in_thread
from .events import DoneEvent, Event
from .params import GenerateParams
from .service import Service
from .streaming import collect_choices, started


class ChatSurface(Protocol):
    """One request's answer in a surface's shapes."""

    call_id_prefix: str  # of the ids given to the reply's calls

    def stream(self, events: AsyncGenerator[Event, None]) -> StreamingResponse:
        """The events as the surface's server-sent events."""
        ...

    def whole(self, dones: Sequence[DoneEvent]) -> dict[str, Any]:
        """The answer not streamed, from each choice's end (``done.reply``: the reply parsed)."""
        ...


@dataclass(frozen=True)
class ChatRequest:
    """What a chat route's body asks for, in the terms rendering takes (each surface's ``chat_request``)."""
    turns: Sequence[Turn]
    tools: Sequence[Tool]
    choice: ToolChoice
    params: GenerateParams
    continue_last: bool = False  # the last (assistant) turn is continued, not closed (Anthropic's prefill)
    n: int = 1                   # choices (OpenAI's n)
    template_kwargs: dict[str, Any] | None = None  # the template's own variables (e.g. enable_thinking)


async def render_chat(template: ChatTemplate, model: Model, chat: ChatRequest, *,
                      mark_tool_results: bool = False) -> tuple[ChatPrompt, list[int], list[tuple[int, int]]]:
    """The request's prompt, its tokens and the token ranges of its tool results (chat_prompt.render_in_thread)."""
    return await render_in_thread(template, model, chat.turns, chat.tools, chat.choice, chat.params,
                                  mark_tool_results=mark_tool_results, continue_last=chat.continue_last,
                                  template_kwargs=chat.template_kwargs)


async def answer_chat(request: Request, surface: ChatSurface, chat: ChatRequest, *, stream: bool) -> Any:
    service: Service = request.app.state.service
    prompt, tokens, tool_spans = await render_chat(request.app.state.chat_template, service.model, chat,
                                                   mark_tool_results=service.sparse_tool_results)
    events = await started(service.complete(tokens, prompt.generate_params(chat.params, surface.call_id_prefix),
                                            tool_spans=tool_spans, n=chat.n))
    if stream:
        return surface.stream(events)
    return surface.whole([done for _, _, done in await collect_choices(events, request.receive)])
