"""Exceptions of pyllamaopt. Catch PyllamaoptError for all of them.

The engine (C++) raises these same classes; each has a ``variable`` attribute naming the
option or LLAMA_OPT_* variable at fault, when there is one.
"""
from __future__ import annotations


class PyllamaoptError(Exception):
    """Base class of every pyllamaopt error."""

    variable: str | None = None


class ConfigError(PyllamaoptError, ValueError):
    """A malformed LLAMA_OPT_* variable or configuration argument."""


class FeatureUnavailableError(ConfigError):
    """An optimization was asked for that this build compiled out."""


class InvalidArgumentError(PyllamaoptError, ValueError):
    """An argument outside its valid range."""


class ModelLoadError(PyllamaoptError):
    """The model file is missing, unreadable, not GGUF, or rejected by llama.cpp."""


class ModelNotFoundError(ModelLoadError):
    """A model name could not be resolved (package not installed, not in the hub cache...)."""


class InvalidTokenError(PyllamaoptError, ValueError):
    """A token id outside the model's vocabulary."""


class ContextOverflowError(PyllamaoptError):
    """The tokens would not fit the context (or the KV cache is full)."""


class SessionClosedError(PyllamaoptError):
    """Use of a session (or context) after close()."""


class SessionEvictedError(SessionClosedError):
    """The session was idle when the KV cache ran out of room, and its KV was dropped
    (least recently used first). Open a new session and sync it to the same tokens."""


class DecodeError(PyllamaoptError):
    """llama.cpp failed to evaluate a batch."""


class ChatTemplateError(PyllamaoptError):
    """The chat template is missing or failed to render."""


class GrammarError(PyllamaoptError, ValueError):
    """An invalid GBNF grammar, an invalid JSON Schema, or a schema the converter cannot
    express. Raised before any token is generated."""


class UnenforceableSchemaError(GrammarError):
    """A JSON Schema constraint that a grammar cannot enforce exactly (``uniqueItems: true``, a
    ``oneOf`` whose alternatives may overlap, ``not``, a regular expression with a lookahead...).
    Raised with ``strict=True``; with ``strict=False`` the constraint is left to the check of the
    finished output (``Generation.schema_valid``). ``keyword`` names the constraint and
    ``path`` is where it is in the schema (a JSON pointer such as ``#/properties/tags``)."""

    def __init__(self, message: str, keyword: str | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.keyword = keyword
        self.path = path


class UnsupportedRegexError(UnenforceableSchemaError):
    """A ``pattern`` (or a ``patternProperties`` key) using a regular-expression construct the
    translator cannot turn into grammar rules (``construct``: a lookahead, a backreference, a
    word boundary...), or one that is not a valid ECMA-262 regular expression."""

    def __init__(self, message: str, construct: str, keyword: str | None = None, path: str | None = None) -> None:
        super().__init__(message, keyword, path)
        self.construct = construct


class DeltaError(PyllamaoptError, ValueError):
    """Bad input to the GGUF delta tool (pyllamaopt.delta): not a GGUF file, a missing or
    unsupported matrix, a rank out of range, a parent model that does not match..."""


class PersistError(PyllamaoptError, OSError):
    """A persistent KV cache directory could not be changed as asked (pyllamaopt.PersistStore):
    files it cannot remove, in a read-only directory or one of another owner."""


class ServerError(PyllamaoptError):
    """An answer of a pyllamaopt server that no local operation gives (raised by pyllamaopt.client,
    which raises the classes above for the rest: SessionClosedError for an unknown, closed, expired
    or evicted session, InvalidTokenError, ContextOverflowError...). ``code``: the gRPC status code's
    name, or the HTTP status."""

    code: str | None = None


class SessionBusyError(ServerError):
    """The session has a generation (or a prefill) in progress: one at a time; retry when it ends."""


class ServerOverloadedError(ServerError):
    """The server has no room now (its KV cache held by generations in progress, or every session
    slot busy): retry later, or start it with a larger --n-ctx or --max-sessions."""


class InvariantViolationError(ServerError):
    """The server found a session's KV inconsistent (specification 003 §2.8: a bug, please report
    it); the session was closed: create a new one and send its tokens again."""


class AuthenticationError(ServerError):
    """The server requires an API key and the call did not carry the right one."""
