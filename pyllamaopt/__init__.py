"""pyllamaopt: local LLM inference over llama.cpp that is cheap for workloads that repeat
themselves, without changing the answers.

    >>> from pyllamaopt import Model, Context
    >>> model = Model("gemma3-270m")               # or a path to any .gguf file
    >>> session = Context(model).session()
    >>> session.append_text("The capital of France is")
    >>> session.generate_text(max_tokens=16)
"""
from __future__ import annotations

from . import _core
from .chat import Chat, ChatTemplate
from .config import OptConfig, features, fields
from .context import Context
from .errors import (
    AuthenticationError,
    ChatTemplateError,
    ConfigError,
    ContextOverflowError,
    DecodeError,
    DeltaError,
    FeatureUnavailableError,
    GrammarError,
    InvalidArgumentError,
    InvalidTokenError,
    InvariantViolationError,
    ModelLoadError,
    ModelNotFoundError,
    PyllamaoptError,
    ServerError,
    ServerOverloadedError,
    SessionBusyError,
    SessionClosedError,
    SessionEvictedError,
    UnenforceableSchemaError,
    UnsupportedRegexError,
)
from .model import Model
from .persist import PersistEntry, PersistStore
from .session import Generation, Session, Token
from .stats import Stats

__version__: str = _core.build_info()["version"]


def build_info() -> dict[str, object]:
    """Versions, the pinned llama.cpp commit and the CPU features this build uses."""
    return dict(_core.build_info())


__all__ = [
    "Chat", "ChatTemplate", "Context", "Generation", "Model", "OptConfig", "PersistEntry", "PersistStore", "Session",
    "Stats", "Token",
    "build_info", "features", "fields",
    "ChatTemplateError", "ConfigError", "ContextOverflowError", "DecodeError", "DeltaError", "FeatureUnavailableError",
    "GrammarError",
    "InvalidArgumentError", "InvalidTokenError", "ModelLoadError", "ModelNotFoundError", "PyllamaoptError",
    "SessionClosedError", "SessionEvictedError", "UnenforceableSchemaError", "UnsupportedRegexError",
    "AuthenticationError", "InvariantViolationError", "ServerError", "ServerOverloadedError", "SessionBusyError",
]
