"""The service's errors: what a client caused or must handle, each with the status a transport maps
to its own (HTTP 4xx/5xx, gRPC codes) and the pyllamaopt exception a client library raises for it."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import (ContextOverflowError, GrammarError, InvalidArgumentError, InvalidTokenError, InvariantViolationError,
                      PyllamaoptError, ServerError, ServerOverloadedError, SessionBusyError, SessionClosedError,
                      SessionEvictedError)

T = TypeVar("T")


class ServiceError(Exception):
    """An error a client caused or must handle; ``status`` is its HTTP-style status, ``kind`` its
    type in an error body, ``error`` the pyllamaopt exception class a client library raises for it
    (the engine's own, when it raised one). A subclass gives them as class keywords."""

    status = 400
    kind = "invalid_request_error"
    error: type[PyllamaoptError] = InvalidArgumentError

    def __init_subclass__(cls, *, status: int | None = None, kind: str | None = None,
                          error: type[PyllamaoptError] | None = None) -> None:
        super().__init_subclass__()
        cls.status = cls.status if status is None else status
        cls.kind = cls.kind if kind is None else kind
        cls.error = cls.error if error is None else error

    def __init__(self, message: str, error: type[PyllamaoptError] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if error is not None:
            self.error = error


class BadRequest(ServiceError):
    """The request cannot be served as it is; the message says what to change."""


class ContextFull(BadRequest, error=ContextOverflowError):
    """More tokens than the context holds (a 400 unless the prompt itself fits: see PrefillCoordinator)."""


class NotFound(ServiceError, status=404, kind="not_found_error", error=SessionClosedError):
    """A session id that names no open session: never created, or closed, expired or evicted."""


class Busy(ServiceError, status=409, kind="conflict_error", error=SessionBusyError):
    """A session in the middle of another operation (one at a time per session)."""


class SessionsFull(Busy, error=ServerOverloadedError):
    """Every session slot (--max-sessions) is taken by a busy session: a 409 like Busy, but over gRPC
    a RESOURCE_EXHAUSTED (it is the server that is full, not this session that is busy)."""


class Overloaded(ServiceError, status=503, kind="overloaded_error", error=ServerOverloadedError):
    """The server cannot take the request now (every sequence in use, the KV cache full with work in
    progress): a client retries later."""


class InternalError(ServiceError, status=500, kind="api_error", error=ServerError):
    """A failure no request should cause (a bug): reported as a 500, with the traceback on stderr."""


class InvariantViolation(ServiceError, status=500, kind="invariant_violation", error=InvariantViolationError):
    """The specification's FAILED_PRECONDITION (003 §2.8): a bug surfaced, never papered over."""


def typed_errors(fn: Callable[[], T]) -> T:
    """`fn()`, the engine's errors a client caused raised as ServiceErrors."""
    try:
        return fn()
    except (SessionClosedError, SessionEvictedError) as exc:
        raise NotFound(str(exc), type(exc)) from None
    except ContextOverflowError as exc:  # the library's advice ("create the Context with ...") in a server's words
        raise ContextFull(str(exc).replace("create the Context with a larger n_ctx",
                                           "restart the server with a larger --n-ctx")) from None
    except (InvalidTokenError, InvalidArgumentError, GrammarError) as exc:
        raise BadRequest(str(exc), type(exc)) from None
