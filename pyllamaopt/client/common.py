"""What both flavours share: requests built from Session.generate's arguments, answers read into
dataclasses, gRPC errors raised as pyllamaopt exceptions."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from .. import errors
from ..tokens import Token
from ..v1 import runtime_pb2 as pb

CANCEL_SETTLES = 5.0  # seconds after a cancel during which the session's "busy" answers are retried
# Generations go on a channel (a connection) of their own whose HTTP/2 stream window is small: what the
# server may send that this client has not read yet, in bytes (a token's message is about 15). A reader
# that stops, or a process the machine does not run for a while, holds the server's generation after
# about 35 tokens (plus the 16 the server runs ahead: 53 generated for a reader of 1, measured), where
# grpc core's defaults let it compute the whole answer unread: a 64 KiB window, grown to 4 MiB and more
# by its bandwidth-delay probe. "grpc.http2.lookahead_bytes" is the stream window the client announces
# (chttp2's initial window size setting); the probe replaces it at its first estimate (with the
# lookahead alone a paused reader still got the whole answer), hence off. Other calls keep the
# defaults on the first channel: a long history's SessionInfo would take a round trip per window.
GENERATION_WINDOW = 512
GENERATION_CHANNEL_OPTIONS = (("grpc.http2.lookahead_bytes", GENERATION_WINDOW), ("grpc.http2.bdp_probe", 0))
ERROR_KEY = "pyllamaopt-error"  # trailing metadata: the exception class's name (serve/grpc_service.py)

# when the server names no class (or one this version does not know)
_BY_CODE: dict[grpc.StatusCode, type[errors.PyllamaoptError]] = {
    grpc.StatusCode.NOT_FOUND: errors.SessionClosedError,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ServerOverloadedError,
    grpc.StatusCode.ABORTED: errors.SessionBusyError,
    grpc.StatusCode.FAILED_PRECONDITION: errors.InvariantViolationError,
    grpc.StatusCode.UNAUTHENTICATED: errors.AuthenticationError,
}


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    n_tokens: int
    tokens: list[int]
    kv_bytes: int
    approx_from: int | None  # Tier 2: where the KV starts being approximate (None: all exact)
    busy: str | None         # "generating", "prefilling" or None
    stats: dict[str, int]    # the session's counters (pyllamaopt.Stats.as_dict())


@dataclass(frozen=True)
class Usage:
    """One generation's counters, as the server counted them."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    computed_tokens: int
    restored_tokens: int
    drafted_tokens: int
    grammar_forced_tokens: int
    approximate: bool


def to_error(exc: Any) -> errors.PyllamaoptError:
    """The pyllamaopt exception for a failed call (a grpc.RpcError or grpc.aio.AioRpcError)."""
    code = exc.code()
    name = dict(exc.trailing_metadata() or ()).get(ERROR_KEY)
    cls = getattr(errors, str(name), None) if name else None
    if not (isinstance(cls, type) and issubclass(cls, errors.PyllamaoptError)):
        cls = _BY_CODE.get(code, errors.ServerError)
    error = cls(f"{exc.details()} ({code.name})")
    error.code = code.name  # type: ignore[attr-defined]
    return error


def info_of(message: pb.SessionInfo) -> SessionInfo:
    return SessionInfo(message.session_id, message.n_tokens, list(message.tokens), message.kv_bytes,
                       message.approx_from if message.HasField("approx_from") else None, message.busy or None,
                       dict(message.stats))


def generate_request(session_id: str, max_tokens: int | None, temperature: float | None, top_k: int | None,
                     top_p: float | None, min_p: float | None, seed: int | None, stop: str | Sequence[str],
                     grammar: str | None, json_schema: dict[str, Any] | bool | None,
                     logit_bias: Mapping[int, float] | None, frequency_penalty: float | None,
                     presence_penalty: float | None, repeat_penalty: float | None,
                     repeat_last_n: int | None) -> pb.GenerateRequest:
    """Session.generate's arguments as a message; None: the server's default (max_tokens None: until the
    end of the answer or a full context). The server validates the values, as the HTTP routes do."""
    if grammar is not None and json_schema is not None:
        raise errors.InvalidArgumentError("give grammar or json_schema, not both")
    request = pb.GenerateRequest(session_id=session_id, max_tokens=(1 << 31) - 1 if max_tokens is None else max_tokens,
                                 temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                                 stop=[stop] if isinstance(stop, str) else list(stop), logit_bias=logit_bias,
                                 frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                 repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n)
    if grammar is not None:
        request.grammar = grammar
    elif json_schema is not None:
        request.json_schema = json.dumps(json_schema)
    return request


class Progress:
    """A generation's state as its messages arrive: Generation's attributes."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_string: str | None = None
        self.usage: Usage | None = None
        self.failed = False  # the call ended in an error: nothing left to cancel

    def take(self, message: pb.GenerateResponse) -> Token | None:
        if message.HasField("token"):
            self.tokens.append(message.token.id)
            self.text += message.token.text
            return Token(message.token.id, message.token.text)
        done = message.done
        self.finish_reason = done.finish_reason
        self.stop_string = done.stop_string if done.HasField("stop_string") else None
        u = done.usage
        self.usage = Usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.computed_tokens,
                           u.restored_tokens, u.drafted_tokens, u.grammar_forced_tokens, u.approximate)
        return None


def metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def channels(transport: Any, address: str, creds: Any) -> tuple[Any, Any]:
    """The client's two channels, of ``transport`` (the module ``grpc`` or ``grpc.aio``): one for
    calls, one for generations (GENERATION_CHANNEL_OPTIONS); ``creds``: TLS credentials or None."""
    def channel(options: tuple[tuple[str, int], ...]) -> Any:
        if creds is None:
            return transport.insecure_channel(address, options=options)
        return transport.secure_channel(address, creds, options=options)

    return channel(()), channel(GENERATION_CHANNEL_OPTIONS)


def credentials(tls: bool, root_certificates: bytes | str | os.PathLike[str] | None) -> Any:
    """The channel's TLS credentials (None: a plaintext channel). ``root_certificates``: the PEM
    certificates to trust (bytes, or a file's path), instead of the system's; giving them means TLS."""
    if root_certificates is None:
        return grpc.ssl_channel_credentials() if tls else None
    pem = root_certificates if isinstance(root_certificates, bytes) else Path(root_certificates).read_bytes()
    return grpc.ssl_channel_credentials(root_certificates=pem)
