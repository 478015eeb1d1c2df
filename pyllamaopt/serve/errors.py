"""The service's errors: what a client caused or must handle, each with the status a transport maps
to its own (HTTP 4xx/5xx, gRPC codes) and the pyllamaopt exception a client library raises for it."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import (
    ContextOverflowError,
    GrammarError,
    InvalidArgumentError,
    InvalidTokenError,
    InvariantViolationError,
    PyllamaoptError,
    ServerError,
    ServerOverloadedError,
    SessionBusyError,
    SessionClosedError,
    SessionEvictedError,
)

T = TypeVar("T")


class ServiceError(Exception):
    """An error a client caused or must handle; ``status`` is its HTTP-style status, ``error`` the
    pyllamaopt exception class a client library raises for it (the engine's own, when it raised one)."""

    status = 400
    kind = "invalid_request_error"
    error: type[PyllamaoptError] = InvalidArgumentError

    def __init__(self, message: str, error: type[PyllamaoptError] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if error is not None:
            self.error = error


class BadRequest(ServiceError):
    pass


class ContextFull(BadRequest):
    """More tokens than the context holds (a 400 unless the prompt itself fits: see PrefillCoordinator)."""

    error = ContextOverflowError


class NotFound(ServiceError):
    status = 404
    kind = "not_found_error"
    error = SessionClosedError


class Busy(ServiceError):
    status = 409
    kind = "conflict_error"
    error: type[PyllamaoptError] = SessionBusyError


class SessionsFull(Busy):
    """Every session slot (--max-sessions) is taken by a busy session: a 409 like Busy, but over gRPC
    a RESOURCE_EXHAUSTED (it is the server that is full, not this session that is busy)."""

    error = ServerOverloadedError


class Overloaded(ServiceError):
    status = 503
    kind = "overloaded_error"
    error = ServerOverloadedError


class InternalError(ServiceError):
    """A failure no request should cause (a bug): reported as a 500, with the traceback on stderr."""

    status = 500
    kind = "api_error"
    error = ServerError


class InvariantViolation(ServiceError):
    """The specification's FAILED_PRECONDITION (003 §2.8): a bug surfaced, never papered over."""

    status = 500
    kind = "invariant_violation"
    error = InvariantViolationError


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
