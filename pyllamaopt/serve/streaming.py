"""What every route does with a generation's events: collect them, or stream them as SSE."""
from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import traceback
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import InternalError, ServiceError
from .events import DoneEvent, Event, TokenEvent


async def started(events: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
    """`events` with its first event already taken: errors of the prompt (a bad token, a prompt
    longer than the context, a schema we cannot express) raise here, before a response starts,
    so they become a 4xx and not a broken stream."""
    first = await events.__anext__()

    async def rest() -> AsyncGenerator[Event, None]:
        async with contextlib.aclosing(events):
            yield first
            async for event in events:
                yield event

    return rest()


class ClientGone(ServiceError):
    """The client of a response that is not streamed went away: its generation ends at once, as a
    stream's does when its client goes (nginx's 499; nobody reads it)."""

    status = 499
    kind = "client_closed_request"


async def collect(events: AsyncGenerator[Event, None], receive: Receive) -> tuple[list[int], str, DoneEvent]:
    """The whole generation, for a response that is not streamed (see collect_choices)."""
    (whole,) = await collect_choices(events, receive)
    return whole


async def collect_choices(events: AsyncGenerator[Event, None],
                          receive: Receive) -> list[tuple[list[int], str, DoneEvent]]:
    """Each choice's tokens, text and end, by index, for a response that is not streamed. The
    request's `receive` is watched meanwhile: a client gone ends the generation at the next event,
    where the server would otherwise compute every token of an answer nobody waits for. (Starlette's
    Request.is_disconnected never sees a disconnect behind an HTTP middleware: its check is a
    receive cancelled at once.)"""
    gone = asyncio.ensure_future(_disconnect(receive))
    tokens: dict[int, list[int]] = {}
    text: dict[int, list[str]] = {}
    done: dict[int, DoneEvent] = {}
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if gone.done():
                    raise ClientGone("the client closed the connection before the answer was complete")
                if isinstance(event, TokenEvent):
                    tokens.setdefault(event.index, []).append(event.id)
                    text.setdefault(event.index, []).append(event.text)
                else:
                    done[event.index] = event
    finally:
        gone.cancel()
    assert done, "a generation always ends with a DoneEvent"
    return [(tokens.get(i, []), "".join(text.get(i, [])), done[i]) for i in sorted(done)]


async def _disconnect(receive: Receive) -> None:
    """Returns once the client is gone (the body was read before: nothing else can come)."""
    with contextlib.suppress(Exception):  # a server that cannot say: never "gone"
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    await asyncio.Event().wait()


def sse(events: AsyncGenerator[Event, None], chunk: Callable[[Event], list[dict[str, Any]]],
        error_shape: Callable[[ServiceError], dict[str, Any]], *, done_line: bool = True,
        named: bool = False, opening: Sequence[dict[str, Any]] = ()) -> StreamingResponse:
    """Server-sent events: `chunk` turns each event into the protocol's JSON payloads, after the
    `opening` ones (a completion's echoed prompt). `named`: each payload's "type" is also the
    event's name (Anthropic's stream); `done_line`: OpenAI's closing "[DONE]"."""
    def line(payload: dict[str, Any]) -> str:
        name = f"event: {payload['type']}\n" if named else ""
        return f"{name}data: {json.dumps(payload)}\n\n"

    async def body() -> AsyncGenerator[str, None]:
        async with contextlib.aclosing(events):
            for payload in opening:
                yield line(payload)
            try:
                async for event in events:
                    for payload in chunk(event):
                        yield line(payload)
            except ServiceError as exc:  # after the response started: the error is the last event
                yield line(error_shape(exc))
            except Exception as exc:  # a bug: the client still gets an error event, not a cut stream
                traceback.print_exc(file=sys.stderr)
                yield line(error_shape(InternalError(f"internal error: {type(exc).__name__}: {exc}")))
            if done_line:
                yield "data: [DONE]\n\n"

    return _ClosingStreamingResponse(body(), media_type="text/event-stream")


class _ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its body when it ends, however it ends. Starlette leaves a
    body it stopped reading (the client left during a send) suspended until the garbage collector
    finds it; closing it at once runs the cleanup down the chain of event generators, which ends
    the session's generation (or it stays 'generating', refusing work, until a gc run)."""
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            body = self.body_iterator
            if isinstance(body, AsyncGenerator):
                await body.aclose()
