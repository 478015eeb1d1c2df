"""The asyncio flavour: AsyncClient, AsyncRemoteSession, AsyncRemoteGeneration (the same methods
as the blocking ones, awaited)."""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc

from ..errors import SessionBusyError, SessionClosedError
from ..tokens import Token
from ..v1 import runtime_pb2 as pb
from ..v1 import runtime_pb2_grpc
from .common import (CANCEL_SETTLES, Progress, SessionInfo, channels, credentials, generate_request, info_of,
                     metadata, to_error)


class AsyncClient:
    """Client for asyncio code: create it inside the event loop (``async with AsyncClient(...)``); the
    arguments are Client's."""

    def __init__(self, address: str, *, api_key: str | None = None, timeout: float | None = None, tls: bool = False,
                 root_certificates: bytes | str | os.PathLike[str] | None = None) -> None:
        self.address = address
        self._channels = channels(grpc.aio, address, credentials(tls, root_certificates))
        self._stub = runtime_pb2_grpc.RuntimeStub(self._channels[0])
        self._generations = runtime_pb2_grpc.RuntimeStub(self._channels[1])  # (its small window: common.py)
        self._metadata = metadata(api_key)
        self.timeout = timeout

    async def create_session(self, tokens: Iterable[int] = ()) -> AsyncRemoteSession:
        answer = await self._call("CreateSession", pb.CreateSessionRequest(tokens=list(tokens)))
        return AsyncRemoteSession(self, answer.session_id)

    def session(self, session_id: str) -> AsyncRemoteSession:
        return AsyncRemoteSession(self, session_id)

    async def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        """Client.tokenize."""
        request = pb.TokenizeRequest(text=text, add_bos=add_bos, special=special)
        return list((await self._call("Tokenize", request)).tokens)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self._stub, method)(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise to_error(exc) from None


class AsyncRemoteSession:
    def __init__(self, client: AsyncClient, session_id: str) -> None:
        self.client = client
        self.id = session_id
        self.closed = False
        self._cancelled_at = -CANCEL_SETTLES  # when a generation of this object was last cancelled

    async def _call(self, method: str, request: Any) -> Any:
        """A call of the session's; right after this object cancelled a generation, a "busy" answer
        (the server stops it between two steps, a moment later) is retried until it settles: as
        in-process, a generation closed is over."""
        while True:
            try:
                return await self.client._call(method, request)
            except SessionBusyError:
                if not self._settling():
                    raise
            await asyncio.sleep(0.01)

    async def append(self, tokens: Iterable[int]) -> None:
        await self._call("AppendTokens", pb.AppendTokensRequest(session_id=self.id, tokens=list(tokens)))

    async def sync(self, tokens: Sequence[int]) -> None:
        await self._call("Sync", pb.SyncRequest(session_id=self.id, tokens=list(tokens)))

    async def fork(self) -> AsyncRemoteSession:
        answer = await self._call("Fork", pb.ForkRequest(session_id=self.id))
        return AsyncRemoteSession(self.client, answer.session_id)

    async def info(self) -> SessionInfo:
        return info_of(await self._call("GetSessionInfo", pb.GetSessionInfoRequest(session_id=self.id)))

    def generate(self, max_tokens: int | None = 256, *, temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None, seed: int | None = None,
                 stop: str | Sequence[str] = (), grammar: str | None = None,
                 json_schema: dict[str, Any] | bool | None = None, logit_bias: Mapping[int, float] | None = None,
                 frequency_penalty: float | None = None, presence_penalty: float | None = None,
                 repeat_penalty: float | None = None, repeat_last_n: int | None = None) -> AsyncRemoteGeneration:
        """``async for token in session.generate(...)``; ``aclose()`` (or leaving an ``async with``
        block) cancels it on the server."""
        request = generate_request(self.id, max_tokens, temperature, top_k, top_p, min_p, seed, stop, grammar,
                                   json_schema, logit_bias, frequency_penalty, presence_penalty, repeat_penalty,
                                   repeat_last_n)
        client = self.client
        return AsyncRemoteGeneration(self, lambda: client._generations.Generate(request, metadata=client._metadata))

    async def generate_text(self, max_tokens: int | None = 256, **kwargs: Any) -> str:
        async with self.generate(max_tokens, **kwargs) as generation:
            async for _ in generation:
                pass
        return generation.text

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self._call("CloseSession", pb.CloseSessionRequest(session_id=self.id))
        except SessionClosedError:
            pass

    def _settling(self) -> bool:
        return time.monotonic() - self._cancelled_at < CANCEL_SETTLES

    async def __aenter__(self) -> AsyncRemoteSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncRemoteGeneration(Progress, AsyncIterator[Token]):
    def __init__(self, session: AsyncRemoteSession, start: Callable[[], Any]) -> None:
        super().__init__()
        self._session = session
        self._start = start
        self._call = start()

    async def __anext__(self) -> Token:
        while self.finish_reason is None:
            try:
                message = await self._call.read()
            except grpc.aio.AioRpcError as exc:
                error = to_error(exc)
                if isinstance(error, SessionBusyError) and not self.tokens and self._session._settling():
                    await asyncio.sleep(0.01)  # see AsyncRemoteSession._call
                    self._call = self._start()
                    continue
                self.failed = True
                raise error from None
            if message is grpc.aio.EOF:
                break
            token = self.take(message)
            if token is not None:
                return token
        raise StopAsyncIteration

    async def aclose(self) -> None:
        if self.finish_reason is None and not self.failed:
            self.finish_reason = "interrupted"
            self._call.cancel()
            self._session._cancelled_at = time.monotonic()

    async def __aenter__(self) -> AsyncRemoteGeneration:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

