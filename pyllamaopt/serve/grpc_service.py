"""The session protocol (specification 003 §2.2) over gRPC: proto/pyllamaopt/v1/runtime.proto.

As thin as session_routes.py: messages become the service's arguments and its answers messages,
ServiceErrors become status codes (STATUS; the trailing metadata "pyllamaopt-error" names the
pyllamaopt exception a client raises), the API key is read from the call's metadata. The server
is a grpc.aio server on the HTTP app's event loop, over the same Service (app.py starts it in the
lifespan): one process, one Context, whichever transport a client uses.
"""
from __future__ import annotations

import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import grpc
from pydantic import ValidationError

from ..v1 import runtime_pb2 as pb
from ..v1 import runtime_pb2_grpc
from .schemas import SessionGenerateRequest
from .errors import (BadRequest, Busy, ContextFull, InternalError, InvariantViolation, NotFound, Overloaded,
                     ServiceError, SessionsFull)
from .events import DoneEvent, Event
from .service import Service

T = TypeVar("T")

# The most specific class in an error's hierarchy decides (SessionsFull is a Busy, ContextFull a BadRequest).
STATUS: dict[type[ServiceError], grpc.StatusCode] = {
    BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    ContextFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    SessionsFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Busy: grpc.StatusCode.ABORTED,
    InvariantViolation: grpc.StatusCode.FAILED_PRECONDITION,
    InternalError: grpc.StatusCode.INTERNAL,
}
ERROR_KEY = "pyllamaopt-error"


def status_of(exc: ServiceError) -> grpc.StatusCode:
    return next((STATUS[c] for c in type(exc).__mro__ if c in STATUS), grpc.StatusCode.INVALID_ARGUMENT)


class RuntimeServicer(runtime_pb2_grpc.RuntimeServicer):
    def __init__(self, service: Service, api_key: str | None) -> None:
        self.service = service
        self.api_key = api_key

    async def CreateSession(self, request: pb.CreateSessionRequest, context: Any) -> pb.CreateSessionResponse:
        session_id = await self._call(context, lambda: self.service.create_session(list(request.tokens)))
        return pb.CreateSessionResponse(session_id=session_id)

    async def AppendTokens(self, request: pb.AppendTokensRequest, context: Any) -> pb.SessionInfo:
        return _info(await self._call(context, lambda: self.service.append(request.session_id, list(request.tokens))))

    async def Sync(self, request: pb.SyncRequest, context: Any) -> pb.SessionInfo:
        return _info(await self._call(context, lambda: self.service.sync(request.session_id, list(request.tokens))))

    async def Fork(self, request: pb.ForkRequest, context: Any) -> pb.ForkResponse:
        return pb.ForkResponse(session_id=await self._call(context, lambda: self.service.fork(request.session_id)))

    async def GetSessionInfo(self, request: pb.GetSessionInfoRequest, context: Any) -> pb.SessionInfo:
        return _info(await self._call(context, lambda: self.service.info(request.session_id)))

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Any) -> pb.CloseSessionResponse:
        await self._call(context, lambda: self.service.close(request.session_id))
        return pb.CloseSessionResponse()

    async def Tokenize(self, request: pb.TokenizeRequest, context: Any) -> pb.TokenizeResponse:
        tokens = await self._call(context, lambda: self.service.tokenize(request.text, add_bos=request.add_bos,
                                                                         special=request.special))
        return pb.TokenizeResponse(tokens=tokens)

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        """A client that cancels raises CancelledError at the next await: leaving the loop closes the
        generation on the scheduler thread, between two steps; the session stays usable."""
        await self._check_key(context)
        try:
            events = self.service.generate(request.session_id, _params(request, self.service.context.n_ctx))
            async with contextlib.aclosing(events):  # cancelled in a write too: closed at once
                async for event in events:
                    yield _event(event)
        except ServiceError as exc:
            await _abort(context, exc)

    async def _call(self, context: Any, op: Callable[[], Awaitable[T]]) -> T:
        await self._check_key(context)
        try:
            return await op()
        except ServiceError as exc:
            await _abort(context, exc)

    async def _check_key(self, context: Any) -> None:
        if not self.api_key:
            return
        metadata = dict(context.invocation_metadata() or ())
        given = str(metadata.get("x-api-key") or "")
        auth = str(metadata.get("authorization") or "")
        if auth.lower().startswith("bearer "):
            given = auth[7:]
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "missing or wrong API key: send the metadata 'authorization: Bearer KEY' or 'x-api-key: KEY'",
                                trailing_metadata=((ERROR_KEY, "AuthenticationError"),))


async def _abort(context: Any, exc: ServiceError) -> NoReturn:
    await context.abort(status_of(exc), exc.message, trailing_metadata=((ERROR_KEY, exc.error.__name__),))
    raise AssertionError("context.abort raises")  # pragma: no cover


def _params(request: pb.GenerateRequest, n_ctx: int) -> Any:
    """The message's fields as the HTTP body would carry them, validated by the same model."""
    fields: dict[str, Any] = {name: getattr(request, name) for name in
                              ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty",
                               "presence_penalty", "repeat_penalty", "repeat_last_n") if request.HasField(name)}
    fields["stop"] = list(request.stop)
    fields["logit_bias"] = {str(token): bias for token, bias in request.logit_bias.items()}  # (JSON's keys)
    constraint = request.WhichOneof("constraint")
    if constraint == "grammar":
        fields["grammar"] = request.grammar
    elif constraint == "json_schema":
        try:
            schema = json.loads(request.json_schema)
        except ValueError as exc:
            raise BadRequest(f"json_schema is not JSON text: {exc}") from None
        fields["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
    try:
        body = SessionGenerateRequest(**fields)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise BadRequest(f"invalid GenerateRequest: {where}") from None
    return body.generate_params(n_ctx)


def _info(info: dict[str, Any]) -> pb.SessionInfo:
    return pb.SessionInfo(session_id=info["session_id"], n_tokens=info["n_tokens"], tokens=info["tokens"],
                          kv_bytes=info["kv_bytes"], approx_from=info["approx_from"], generating=info["generating"],
                          busy=info["busy"] or "", stats=info["stats"])


def _event(event: Event) -> pb.GenerateResponse:
    if isinstance(event, DoneEvent):
        return pb.GenerateResponse(done=pb.Done(finish_reason=event.finish_reason, usage=pb.Usage(**event.usage.as_dict()),
                                                stop_string=event.stop_string))
    return pb.GenerateResponse(token=pb.Token(id=event.id, text=event.text))


async def start(service: Service, host: str, port: int, api_key: str | None,
                tls: tuple[str, str] | None = None) -> Any:
    """A running grpc.aio server on host:port (on the running event loop), over TLS with ``tls``
    (certificate and private key PEM files); stop it with ``await server.stop(grace)``."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # (on: a second server shared the port, silently)
    runtime_pb2_grpc.add_RuntimeServicer_to_server(RuntimeServicer(service, api_key), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if tls is None:
            server.add_insecure_port(address)
        else:
            cert, key = (Path(f).read_bytes() for f in tls)
            server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    except RuntimeError as exc:
        raise SystemExit(f"pyllamaopt serve: cannot bind the gRPC port {address}: {exc}") from None
    await server.start()
    return server
