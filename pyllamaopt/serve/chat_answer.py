"""What both chat surfaces (OpenAI's /v1/chat/completions, Anthropic's /v1/messages) do with a
request, written once: render the prompt, complete it (the service parses the reply as it streams,
and its events carry the parse), then answer, streamed as server-sent events or whole. A surface
only shapes the payloads (ChatSurface)."""
from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import StreamingResponse

from .chat_messages import Tool, ToolChoice, Turn
from .chat_prompt import render_in_thread
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


async def answer_chat(request: Request, surface: ChatSurface, turns: Sequence[Turn], tools: Sequence[Tool],
                      choice: ToolChoice, params: GenerateParams, *, stream: bool, continue_last: bool = False,
                      n: int = 1) -> Any:
    service: Service = request.app.state.service
    prompt, tokens, tool_spans = await render_in_thread(
        request.app.state.chat_template, service.model, turns, tools, choice, params,
        mark_tool_results=service.sparse_tool_results, continue_last=continue_last)
    events = await started(service.complete(tokens, prompt.generate_params(params, surface.call_id_prefix),
                                            tool_spans=tool_spans, n=n))
    if stream:
        return surface.stream(events)
    return surface.whole([done for _, _, done in await collect_choices(events, request.receive)])
