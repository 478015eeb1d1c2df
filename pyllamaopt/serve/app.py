"""The server: settings, the FastAPI app, and what it does at start and stop.

    pyllamaopt serve --model MODEL [--host 127.0.0.1] [--port 8080] [--grpc-port PORT] [--api-key KEY]
                     [--tls-cert CERT.pem --tls-key KEY.pem] ...

One process owns one Context, whichever the transport (HTTP/JSON, and gRPC with --grpc-port: the same
host, API key, TLS certificate, event loop and service); the scheduler thread does all compute (scheduler.py); routes
are a few lines over the service (service.py), one file per surface.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import ipaddress
import math
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..chat import ChatTemplate
from ..config import OptConfig
from ..context import Context
from ..errors import AuthenticationError, ChatTemplateError
from ..grammar import WHITESPACE
from ..model import Model
from ..session import Session
from . import anthropic_routes, openai_routes, session_routes
from .metrics import Metrics
from .scheduler import Scheduler
from .schema_cache import DEFAULT_JSON_WHITESPACE
from .errors import InternalError, ServiceError
from .service import Service


@dataclass
class ServeSettings:
    model: str = "gemma3-270m"
    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = None     # the session protocol over gRPC too (grpc_service.py)
    n_ctx: int = 4096
    threads: int | None = None
    api_key: str | None = None
    tls_cert: str | None = None      # PEM certificate (chain) and its private key: HTTPS and gRPC over TLS
    tls_key: str | None = None
    max_sessions: int = 16           # protocol sessions open at once; the least recently used idle one goes first
    session_ttl: float = 30 * 60.0   # seconds an idle protocol session is kept
    max_body_bytes: int = 16 << 20
    kv_type: str | None = None       # OptConfig's kv_type (None: $LLAMA_OPT_KV_TYPE or f16)
    kv_type_k: str | None = None     # OptConfig's kv_type_k (None: $LLAMA_OPT_KV_TYPE_K or kv_type's)
    kv_type_v: str | None = None     # OptConfig's kv_type_v (None: $LLAMA_OPT_KV_TYPE_V or kv_type's)
    approximate_reuse: bool = False  # Tier 2: diff_reuse_shifted (service.py says how requests use it)
    sparse_tool_results: bool = False  # Tier 2: sparse_attn_enabled, the chat routes mark tool results
    json_whitespace: str = DEFAULT_JSON_WHITESPACE  # how response_format answers lay out JSON (grammar.WHITESPACE)
    chat_template_file: str | None = None  # the chat routes' template instead of the GGUF's (--chat-template-file)
    verbose: bool = False
    session_id_prefix: str = ""      # leads every protocol session id (a Ray replica's own: pyllamaopt/ray)

    def set_kv_types(self, config: OptConfig) -> OptConfig:
        """`config` with the KV cache types given here set (OptConfig's kv_type, kv_type_k, kv_type_v)."""
        given = {"kv_type": self.kv_type, "kv_type_k": self.kv_type_k, "kv_type_v": self.kv_type_v}
        for name, value in given.items():
            if value is not None:
                config.set(name, value)
        return config

    def check(self) -> None:
        """Refuses settings a server must not run with; the messages say what to change."""
        if not _is_loopback(self.host) and not self.api_key:
            raise SystemExit(f"pyllamaopt serve: --host {self.host} is reachable from other machines: "
                             "give --api-key (or LLAMA_OPT_SERVE_API_KEY), or bind 127.0.0.1")
        if not 1 <= self.max_sessions <= 200:
            raise SystemExit("pyllamaopt serve: --max-sessions must be between 1 and 200")
        if not (math.isfinite(self.session_ttl) and self.session_ttl > 0):  # (nan: sessions never expired)
            raise SystemExit("pyllamaopt serve: --session-ttl must be a positive number of seconds")
        if self.json_whitespace not in WHITESPACE:
            raise SystemExit(f"pyllamaopt serve: --json-whitespace (LLAMA_OPT_SERVE_JSON_WHITESPACE) must be one of "
                             f"{', '.join(WHITESPACE)}, got {self.json_whitespace!r}")
        if not 0 < self.port < 65536:
            raise SystemExit("pyllamaopt serve: --port must be a port number (1-65535)")
        if self.grpc_port is not None and (not 0 < self.grpc_port < 65536 or self.grpc_port == self.port):
            raise SystemExit("pyllamaopt serve: --grpc-port must be a port number other than --port")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SystemExit("pyllamaopt serve: give both --tls-cert and --tls-key (LLAMA_OPT_SERVE_TLS_CERT, "
                             "LLAMA_OPT_SERVE_TLS_KEY), or neither")
        if self.tls_cert and self.tls_key:
            try:  # the pair is loaded here, so that a bad file stops the server before the model loads
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.tls_cert, self.tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise SystemExit(f"pyllamaopt serve: --tls-cert {self.tls_cert} / --tls-key {self.tls_key}: cannot "
                                 f"load them as a PEM certificate and its private key ({exc})") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# A field no route declares (schemas.py): refused, not ignored, since it could change the answer.
_UNKNOWN_FIELD = ("this server does not take this field, and refuses it rather than ignore it (docs/serve.md lists "
                  "the fields it takes)")

# Sequences a context needs: protocol sessions, requests in flight, closed ones kept for reuse.
_REQUEST_SEQUENCES = 16


def create_app(settings: ServeSettings, config: OptConfig | None = None) -> FastAPI:
    model = Model(settings.model, verbose=settings.verbose)
    config = settings.set_kv_types(config if config is not None else OptConfig())
    if settings.approximate_reuse:
        config.set("diff_reuse_shifted", True)
    if settings.sparse_tool_results:
        config.set("sparse_attn_enabled", True)
    context = Context(model, n_ctx=settings.n_ctx, n_threads=settings.threads,
                      n_seq_max=settings.max_sessions + _REQUEST_SEQUENCES, config=config)
    _say_foreign_entries(context, settings.model)
    scheduler = Scheduler(prefetch=Session.prefetch_steps)  # decode steps of concurrent generations batched
    metrics = Metrics()
    service = Service(context, scheduler, metrics, max_sessions=settings.max_sessions,
                      session_ttl=settings.session_ttl, json_whitespace=settings.json_whitespace,
                      session_id_prefix=settings.session_id_prefix)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_expire_idle(service, min(settings.session_ttl / 4, 30.0)))
        grpc_server = None
        if settings.grpc_port is not None:
            from . import grpc_service

            tls = (settings.tls_cert, settings.tls_key) if settings.tls_cert and settings.tls_key else None
            grpc_server = await grpc_service.start(service, settings.host, settings.grpc_port, settings.api_key, tls=tls)
        if hasattr(app.state, "ready_line"):  # (serve(): not an app a test runs in-process)
            print(app.state.ready_line, file=sys.stderr, flush=True)
        yield
        sweeper.cancel()
        if grpc_server is not None:
            await grpc_server.stop(5)  # calls in flight get 5 s, then are cancelled
        closed = service.close_all()  # with persistence on, sessions are saved as they close
        scheduler.stop()
        context.close()
        print(f"pyllamaopt serve: stopped; {closed} open sessions closed", file=sys.stderr, flush=True)

    app = FastAPI(title="pyllamaopt", lifespan=lifespan)
    app.state.service = service
    app.state.model_name = Path(model.path).stem
    try:
        app.state.chat_template = ChatTemplate.for_model(model, file=settings.chat_template_file)
    except ChatTemplateError as exc:
        if settings.chat_template_file:  # asked for: a file that cannot be used stops the server, saying why
            raise SystemExit(f"pyllamaopt serve: --chat-template-file: {exc}") from None
        app.state.chat_template = NoChatTemplate(str(exc))  # chat routes will say so; the rest works

    app.include_router(openai_routes.router)
    app.include_router(anthropic_routes.router)
    app.include_router(session_routes.router)
    app.include_router(session_routes.tokenizer_router)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return service.health()

    @app.get("/metrics")
    async def prometheus() -> Response:
        service.health()  # the queue's depth now
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    def error_response(request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse(error_body(request.url.path, exc), status_code=exc.status)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        kind = request.headers.get("content-type", "")
        if request.method == "POST" and not _is_json(kind):  # (FastAPI then says "Input should be a valid dictionary")
            return error_response(request, ServiceError(f"the request body must be JSON, sent with 'Content-Type: "
                                                        f"application/json' (got {kind or 'no content type'!r})"))
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {_UNKNOWN_FIELD if e['type'] == 'extra_forbidden' else e['msg']}"
                          for e in exc.errors())
        return error_response(request, ServiceError(f"invalid request body: {where}"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # the framework's own (a body it cannot parse, an unknown route): the protocol's error shape too
        return error_response(request, _Refused(str(exc.detail), exc.status_code,
                                                "not_found_error" if exc.status_code == 404 else "invalid_request_error"))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # a bug: still the protocol's JSON shape (a text/plain 500 made the client libraries retry it);
        # the traceback goes to stderr (Starlette re-raises it to the server, which logs it)
        return error_response(request, InternalError(f"internal error ({type(exc).__name__}); the server's log has "
                                                     "the details"))

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if settings.api_key and request.url.path not in ("/health",) and not _authorized(request, settings.api_key):
            return error_response(request, _Refused("missing or wrong API key: send 'Authorization: Bearer KEY' "
                                                    "or 'x-api-key: KEY'", 401, "authentication_error"))
        too_large = _Refused(f"request body larger than {settings.max_body_bytes} bytes", 413, "invalid_request_error")
        length = request.headers.get("content-length")
        if length is not None:
            if length.isdigit() and int(length) > settings.max_body_bytes:
                return error_response(request, too_large)
        elif request.method in ("POST", "PUT", "PATCH"):  # chunked: counted as it comes
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > settings.max_body_bytes:
                    return error_response(request, too_large)
                chunks.append(chunk)
            request._body = b"".join(chunks)  # what the route reads (Starlette replays a body read here)
        return await call_next(request)

    return app


def error_body(path: str, exc: ServiceError) -> dict[str, Any]:
    """The error in the shape of the protocol of the route at `path`."""
    shape = (anthropic_routes.error_body if path.startswith("/v1/messages") else
             session_routes.error_body if path.startswith(("/v1/sessions", "/v1/tokenize")) else openai_routes.error_body)
    return shape(exc)


class _Refused(ServiceError):
    """A request the guard refuses before any route, in the error shape of the route it was for."""

    def __init__(self, message: str, status: int, kind: str) -> None:
        super().__init__(message, AuthenticationError if status == 401 else None)
        self.status, self.kind = status, kind


def _authorized(request: Request, key: str) -> bool:
    given = request.headers.get("x-api-key") or ""
    auth = request.headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        given = auth[7:]
    return hmac.compare_digest(given.encode(), key.encode())


class NoChatTemplate:
    """Stands in for a model without a chat template: chat routes answer 400 with the reason."""

    takes_tools = native_tools = False

    def __init__(self, why: str) -> None:
        self.why = why

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        raise ChatTemplateError(self.why)

    def render(self, *args: Any, **kwargs: Any) -> str:
        raise ChatTemplateError(self.why)

    def render_marked(self, *args: Any, **kwargs: Any) -> tuple[str, list[tuple[int, int]]]:
        raise ChatTemplateError(self.why)  # (--sparse-tool-results renders this way)


def _say_foreign_entries(context: Context, model: str) -> None:
    """Once, at the start: entries of the disk tier this server never restores (another model's,
    build's or KV type's: each would be a miss), so that an operator who expected a warm restart
    knows why not."""
    store = context.persist
    layout = None if store is None else context.persist_layout
    if store is None or layout is None:
        return
    foreign, entries = store.foreign(layout), store.entries()
    if foreign:
        server = f"--model {model}{_kv_type_options(context)}"  # (the cache commands must see this server's types)
        print(f"pyllamaopt serve: {len(foreign)} of {len(entries)} entries in {store.directory} are for another model, "
              f"build or KV type and will not be used; `pyllamaopt cache ls {server}` marks them, `pyllamaopt cache "
              f"clean --foreign {server}` removes them (not done here: a server of the other model may share the "
              "directory)", file=sys.stderr, flush=True)


def _kv_type_options(context: Context) -> str:
    """The serve options of the context's KV types: '' for f16, the default."""
    if context.kv_type_k == context.kv_type_v:
        return "" if context.kv_type == "f16" else f" --kv-type {context.kv_type}"
    return f" --kv-type-k {context.kv_type_k} --kv-type-v {context.kv_type_v}"


async def _expire_idle(service: Service, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        await service.expire_idle()


def serve(settings: ServeSettings) -> None:
    import uvicorn

    settings.check()
    # the ports are taken before the model loads: one in use is a message now, not a stack trace later
    http = _listening_sockets(settings.host, settings.port, "--port")
    if settings.grpc_port is not None:
        for sock in _listening_sockets(settings.host, settings.grpc_port, "--grpc-port"):
            sock.close()  # gRPC binds it again
    app = create_app(settings)
    scheme = "https" if settings.tls_cert else "http"
    app.state.ready_line = (f"pyllamaopt serve: {app.state.model_name} on {scheme}://{_address(settings.host, settings.port)}"
                            + (f", gRPC on {_address(settings.host, settings.grpc_port)}" if settings.grpc_port else "")
                            + f" (n_ctx {app.state.service.context.n_ctx}, kv_type {app.state.service.context.kv_type})"
                            + "; Ctrl-C stops it")
    config = uvicorn.Config(app, log_level="info" if settings.verbose else "warning", timeout_graceful_shutdown=30,
                            ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: a clean stop (uvicorn re-raises the signal it handled)
        uvicorn.Server(config).run(sockets=http)


def _is_json(content_type: str) -> bool:
    """Whether FastAPI reads a body of this type as JSON: application/json or application/*+json."""
    main, _, sub = content_type.split(";")[0].strip().lower().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listening_sockets(host: str, port: int, option: str) -> list[socket.socket]:
    """Listening sockets on every address `host` names (as asyncio binds a host: "localhost" is
    127.0.0.1 and ::1), or a message saying what to change."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise SystemExit(f"pyllamaopt serve: --host {host}: not an address of this machine ({exc.strerror})") from None
    sockets: list[socket.socket] = []
    for family, kind, proto, _, address in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        sockets.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # (its IPv4 twin has its own socket)
        try:
            sock.bind(address)
            sock.listen(2048)  # listening now: a second server's bind fails, even before this one serves
        except OSError as exc:
            for s in sockets:
                s.close()
            hint = (f"another program listens there: stop it, or choose another port with {option}"
                    if exc.errno == errno.EADDRINUSE else "choose another address or port")
            raise SystemExit(f"pyllamaopt serve: cannot listen on {_address(str(address[0]), port)} ({exc.strerror}): "
                             f"{hint}") from None
    return sockets
