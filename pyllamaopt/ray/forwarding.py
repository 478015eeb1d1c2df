"""A request as a value the gateway hands to an engine replica, and the replica's in-process call of
our FastAPI app with it: the routes, their validation, errors and streaming are the single server's,
unchanged; Ray only carries bytes between the two."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from .affinity import Affinity

Headers = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True)
class ForwardedRequest:
    method: str
    path: str
    query: bytes
    headers: Headers
    body: bytes
    affinity: Affinity | None = None  # what the router places it by (None: the least loaded replica)


@dataclass(frozen=True)
class ResponseStart:
    """The first item of a forwarded request's answer; the body's chunks (bytes) follow."""
    status: int
    headers: Headers


async def call_app(app: Any, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
    """Runs `request` through the ASGI `app` in this process, yielding its answer as it streams. Closing
    the iterator early is a client that left: the app sees http.disconnect (a generation stops)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
             "scheme": "http", "path": request.path, "raw_path": request.path.encode(), "query_string": request.query,
             "root_path": "", "headers": list(request.headers), "client": ("127.0.0.1", 0),
             "server": ("127.0.0.1", 0)}
    messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    left = asyncio.Event()
    body_given = False

    async def receive() -> dict[str, Any]:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await messages.put(message)

    task = asyncio.create_task(app(scope, receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                yield ResponseStart(message["status"], tuple(message.get("headers", ())))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    break
    finally:
        left.set()
        # an app error after its answer was sent (Starlette re-raises it to the server) is in the
        # replica's log already; nothing more is owed to the client
        with contextlib.suppress(Exception):
            await task
