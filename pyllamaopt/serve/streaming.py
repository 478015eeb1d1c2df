"""What every route does with a generation's events: collect them, or stream them as SSE."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from .service import DoneEvent, Event, ServiceError, TokenEvent


async def started(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    """`events` with its first event already taken: errors of the prompt (a bad token, a prompt
    longer than the context, a schema we cannot express) raise here, before a response starts,
    so they become a 4xx and not a broken stream."""
    first = await events.__anext__()

    async def rest() -> AsyncIterator[Event]:
        yield first
        async for event in events:
            yield event

    return rest()


async def collect(events: AsyncIterator[Event]) -> tuple[list[int], str, DoneEvent]:
    tokens: list[int] = []
    text: list[str] = []
    done = None
    async for event in events:
        if isinstance(event, TokenEvent):
            tokens.append(event.id)
            text.append(event.text)
        else:
            done = event
    assert done is not None, "a generation always ends with a DoneEvent"
    return tokens, "".join(text), done


def sse(events: AsyncIterator[Event], chunk: Callable[[Event], list[dict[str, Any]]],
        error_shape: Callable[[ServiceError], dict[str, Any]], *, done_line: bool = True,
        named: bool = False, prologue: list[dict[str, Any]] | None = None) -> StreamingResponse:
    """Server-sent events: `chunk` turns each event into the protocol's JSON payloads, after the
    `prologue` payloads. `named`: each payload's "type" is also the event's name (Anthropic's
    stream); `done_line`: OpenAI's closing "[DONE]"."""
    def line(payload: dict[str, Any]) -> str:
        name = f"event: {payload['type']}\n" if named else ""
        return f"{name}data: {json.dumps(payload)}\n\n"

    async def body() -> AsyncIterator[str]:
        for payload in prologue or []:
            yield line(payload)
        try:
            async for event in events:
                for payload in chunk(event):
                    yield line(payload)
        except ServiceError as exc:  # after the response started: the error is the last event
            yield line(error_shape(exc))
        if done_line:
            yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")
