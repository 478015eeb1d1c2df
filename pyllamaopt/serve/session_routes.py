"""The session protocol (specification 003 §2.2) over HTTP/JSON: raw token ids, no template.

    POST   /v1/sessions                  {"tokens": [...]}  -> {"session_id": "..."}
    POST   /v1/sessions/{id}/tokens      {"tokens": [...]}  append     -> session info
    POST   /v1/sessions/{id}/sync        {"tokens": [...]}  set history (our extension)
    POST   /v1/sessions/{id}/fork                           -> {"session_id": "..."} (our extension)
    POST   /v1/sessions/{id}/generate    sampling fields as OpenAI names them, "grammar"; "stream": SSE of
                                         {"token", "text"} events, then {"finish_reason", "usage",
                                         "stop_string"}
    GET    /v1/sessions/{id}                                GetSessionInfo
    DELETE /v1/sessions/{id}                                CloseSession
    POST   /v1/tokenize                  {"text", "add_bos", "special"} -> {"tokens": [...]} (Tokenize)
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from .schemas import SessionGenerateRequest, TokenizeRequest, Tokens
from .errors import ServiceError
from .events import Event, TokenEvent
from .service import Service
from .streaming import collect, sse, started

router = APIRouter(prefix="/v1/sessions")
tokenizer_router = APIRouter()


def _service(request: Request) -> Service:
    return request.app.state.service


def error_body(exc: ServiceError) -> dict[str, Any]:
    """The error's message, kind, and the pyllamaopt exception class a client raises for it (the
    gRPC transport's "pyllamaopt-error" metadata)."""
    return {"error": {"message": exc.message, "type": exc.kind, "pyllamaopt_error": exc.error.__name__}}


@router.post("", status_code=201)
async def create(request: Request, body: Tokens | None = None) -> dict[str, str]:
    return {"session_id": await _service(request).create_session(body.tokens if body else [])}


@router.post("/{session_id}/tokens")
async def append(session_id: str, body: Tokens, request: Request) -> dict[str, Any]:
    return await _service(request).append(session_id, body.tokens)


@router.post("/{session_id}/sync")
async def sync(session_id: str, body: Tokens, request: Request) -> dict[str, Any]:
    return await _service(request).sync(session_id, body.tokens)


@router.post("/{session_id}/fork", status_code=201)
async def fork(session_id: str, request: Request) -> dict[str, str]:
    return {"session_id": await _service(request).fork(session_id)}


@router.get("/{session_id}")
async def info(session_id: str, request: Request) -> dict[str, Any]:
    return await _service(request).info(session_id)


@router.delete("/{session_id}", status_code=204)
async def close(session_id: str, request: Request) -> Response:
    await _service(request).close(session_id)
    return Response(status_code=204)


@router.post("/{session_id}/generate")
async def generate(session_id: str, body: SessionGenerateRequest, request: Request) -> Any:
    service = _service(request)
    params = body.generate_params(service.context.n_ctx)
    events = await started(service.generate(session_id, params))
    if body.stream:
        def chunk(event: Event) -> list[dict[str, Any]]:
            if isinstance(event, TokenEvent):
                return [{"token": event.id, "text": event.text}]
            return [event.session_fields()]

        return sse(events, chunk, error_body, done_line=False)
    tokens, text, done = await collect(events, request.receive)
    return {"tokens": tokens, "text": text, **done.session_fields()}


@tokenizer_router.post("/v1/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, list[int]]:
    return {"tokens": await _service(request).tokenize(body.text, add_bos=body.add_bos, special=body.special)}
