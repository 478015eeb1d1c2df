"""The blocking flavour: Client, RemoteSession, RemoteGeneration."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc

from ..errors import SessionBusyError, SessionClosedError
from ..tokens import Token
from ..v1 import runtime_pb2 as pb
from ..v1 import runtime_pb2_grpc
from .common import (CANCEL_SETTLES, Progress, SessionInfo, channels, credentials, generate_request, info_of,
                     metadata, to_error)


class Client:
    """A connection to `pyllamaopt serve --grpc-port PORT` at ``address`` ("host:port").
    ``api_key``: the server's --api-key (sent as 'authorization: Bearer KEY'). ``tls``: connect over
    TLS (a server with --tls-cert), trusting the system's root certificates, or ``root_certificates``
    (PEM bytes or a file's path: a private CA's, or a self-signed certificate; implies TLS)."""

    def __init__(self, address: str, *, api_key: str | None = None, timeout: float | None = None, tls: bool = False,
                 root_certificates: bytes | str | os.PathLike[str] | None = None) -> None:
        self.address = address
        self._channels = channels(grpc, address, credentials(tls, root_certificates))
        self._stub = runtime_pb2_grpc.RuntimeStub(self._channels[0])
        self._generations = runtime_pb2_grpc.RuntimeStub(self._channels[1])  # (its small window: common.py)
        self._metadata = metadata(api_key)
        self.timeout = timeout  # seconds per call except generations (None: no limit)

    def create_session(self, tokens: Iterable[int] = ()) -> RemoteSession:
        """A new session on the server, its history set to ``tokens``."""
        answer = self._call("CreateSession", pb.CreateSessionRequest(tokens=list(tokens)))
        return RemoteSession(self, answer.session_id)

    def session(self, session_id: str) -> RemoteSession:
        """A session created earlier (by this client or another), by its id."""
        return RemoteSession(self, session_id)

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        """The server's model's token ids of ``text`` (no template), for a client without a tokenizer of
        its own. ``add_bos``: the model's BOS token first (if it uses one; off by default, unlike
        Model.tokenize: most pieces of a history follow others); ``special``: special-token text such
        as ``<start_of_turn>`` parsed as those tokens (keep it off for text users typed)."""
        request = pb.TokenizeRequest(text=text, add_bos=add_bos, special=special)
        return list(self._call("Tokenize", request).tokens)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise to_error(exc) from None


class RemoteSession:
    """A session on the server, with Session's methods and their meaning: ``append`` (all or
    nothing), ``sync``, ``fork``, ``generate``, ``close``; ``info()`` asks the server for its state."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.id = session_id
        self.closed = False
        self._cancelled_at = -CANCEL_SETTLES  # when a generation of this object was last cancelled

    def _call(self, method: str, request: Any) -> Any:
        """A call of the session's; right after this object cancelled a generation, a "busy" answer
        (the server stops it between two steps, a moment later) is retried until it settles: as
        in-process, a generation closed is over."""
        while True:
            try:
                return self.client._call(method, request)
            except SessionBusyError:
                if not self._settling():
                    raise
            time.sleep(0.01)

    def append(self, tokens: Iterable[int]) -> None:
        self._call("AppendTokens", pb.AppendTokensRequest(session_id=self.id, tokens=list(tokens)))

    def sync(self, tokens: Sequence[int]) -> None:
        self._call("Sync", pb.SyncRequest(session_id=self.id, tokens=list(tokens)))

    def fork(self) -> RemoteSession:
        return RemoteSession(self.client, self._call("Fork", pb.ForkRequest(session_id=self.id)).session_id)

    def info(self) -> SessionInfo:
        return info_of(self._call("GetSessionInfo", pb.GetSessionInfoRequest(session_id=self.id)))

    @property
    def tokens(self) -> list[int]:
        return self.info().tokens

    @property
    def n_tokens(self) -> int:
        return self.info().n_tokens

    def generate(self, max_tokens: int | None = 256, *, temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None, seed: int | None = None,
                 stop: str | Sequence[str] = (), grammar: str | None = None,
                 json_schema: dict[str, Any] | bool | None = None, logit_bias: Mapping[int, float] | None = None,
                 frequency_penalty: float | None = None, presence_penalty: float | None = None,
                 repeat_penalty: float | None = None, repeat_last_n: int | None = None) -> RemoteGeneration:
        """Streams the generated tokens as the server commits them (Session.generate's arguments;
        None: the server's default). Leaving the loop early cancels the generation on the server
        (when the object is dropped, or at once with ``close()`` or a ``with`` block)."""
        request = generate_request(self.id, max_tokens, temperature, top_k, top_p, min_p, seed, stop, grammar,
                                   json_schema, logit_bias, frequency_penalty, presence_penalty, repeat_penalty,
                                   repeat_last_n)
        client = self.client
        return RemoteGeneration(self, lambda: client._generations.Generate(request, metadata=client._metadata))

    def generate_text(self, max_tokens: int | None = 256, **kwargs: Any) -> str:
        with self.generate(max_tokens, **kwargs) as generation:
            for _ in generation:
                pass
        return generation.text

    def close(self) -> None:
        """Closes the session on the server (nothing happens if it was closed, expired or evicted)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._call("CloseSession", pb.CloseSessionRequest(session_id=self.id))
        except SessionClosedError:
            pass

    def _settling(self) -> bool:
        return time.monotonic() - self._cancelled_at < CANCEL_SETTLES

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RemoteSession {self.id} at {self.client.address}{' closed' if self.closed else ''}>"


class RemoteGeneration(Progress, Iterator[Token]):
    """Generation's attributes (``tokens``, ``text``, ``finish_reason``, ``stop_string``) and
    ``usage``: what the server counted, after the end."""

    def __init__(self, session: RemoteSession, start: Callable[[], Any]) -> None:
        super().__init__()
        self._session = session
        self._start = start
        self._call = start()

    def __next__(self) -> Token:
        while self.finish_reason is None:
            try:
                message = next(self._call)
            except StopIteration:
                break
            except grpc.RpcError as exc:
                error = to_error(exc)
                if isinstance(error, SessionBusyError) and not self.tokens and self._session._settling():
                    time.sleep(0.01)  # see RemoteSession._call
                    self._call = self._start()
                    continue
                self.failed = True
                raise error from None
            token = self.take(message)
            if token is not None:
                return token
        raise StopIteration

    def close(self) -> None:
        """Stops the generation on the server (``finish_reason`` 'interrupted' unless it was over)."""
        if self.finish_reason is None and not self.failed:
            self.finish_reason = "interrupted"
            self._call.cancel()
            self._session._cancelled_at = time.monotonic()

    def __enter__(self) -> RemoteGeneration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_call", None) is not None:
            self.close()
