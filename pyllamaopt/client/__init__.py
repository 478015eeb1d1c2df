"""Client of `pyllamaopt serve --grpc-port`: remote sessions with the in-process Session's methods.

    >>> from pyllamaopt.client import Client
    >>> with Client("127.0.0.1:50051") as client, client.create_session(tokens=prompt) as session:
    ...     session.append(more)
    ...     for token in session.generate(32):
    ...         print(token.text, end="")

``AsyncClient`` is the same with ``await`` (and ``async for``/``async with``). Errors are the
pyllamaopt exceptions (errors.py): SessionClosedError for a session unknown, closed, expired or
evicted, InvalidTokenError, ContextOverflowError, GrammarError, InvalidArgumentError, and the
server's own (ServerError: SessionBusyError, ServerOverloadedError, InvariantViolationError,
AuthenticationError). ``chat_tokens`` renders chat messages with a model's template (opt-in: it
loads the model locally).
"""
from __future__ import annotations

from .aio import AsyncClient, AsyncRemoteGeneration, AsyncRemoteSession
from .chat import chat_tokens
from .common import SessionInfo, Usage
from .sync import Client, RemoteGeneration, RemoteSession

__all__ = ["AsyncClient", "AsyncRemoteGeneration", "AsyncRemoteSession", "Client", "RemoteGeneration",
           "RemoteSession", "SessionInfo", "Usage", "chat_tokens"]
