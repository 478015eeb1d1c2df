"""pyllamaopt: local LLM inference over llama.cpp that is cheap for workloads that repeat
themselves, without changing the answers.

    >>> from pyllamaopt import Model, Context
    >>> model = Model("gemma3-270m")               # or a path to any .gguf file
    >>> session = Context(model).session()
    >>> session.append_text("The capital of France is")
    >>> session.generate_text(max_tokens=16)

The compiled engine (pyllamaopt._core, llama.cpp) is loaded on first use of what needs it (Model,
Context, ...), not on ``import pyllamaopt``: ``pyllamaopt.client`` and ``pyllamaopt.errors`` work on a
machine that only talks to a server (docs/client.md).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    PersistError,
    PyllamaoptError,
    ServerError,
    ServerOverloadedError,
    SessionBusyError,
    SessionClosedError,
    SessionEvictedError,
    UnenforceableSchemaError,
    UnsupportedRegexError,
)
from .tokens import Token, TokenLogprob

if TYPE_CHECKING:
    from .chat import Chat, ChatTemplate
    from .config import OptConfig, features, fields
    from .context import Context
    from .model import Model
    from .persist import PersistEntry, PersistStore
    from .session import Generation, Session
    from .stats import Stats

    __version__: str

# name -> the module that defines it, imported on first access (PEP 562)
_LAZY = {
    "Chat": "chat", "ChatTemplate": "chat", "OptConfig": "config", "features": "config", "fields": "config",
    "Context": "context", "Model": "model", "PersistEntry": "persist", "PersistStore": "persist",
    "Generation": "session", "Session": "session", "Stats": "stats",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = build_info()["version"]
    elif name in _LAZY:
        value = getattr(_engine_module(f".{_LAZY[name]}"), name)
    else:
        raise AttributeError(f"module 'pyllamaopt' has no attribute {name!r}")
    globals()[name] = value
    return value


def _engine_module(module: str) -> Any:
    """`module` of this package; an ImportError that says why when the compiled engine is missing."""
    try:
        return importlib.import_module(module, __name__)
    except ImportError as exc:
        if "_core" not in str(exc):
            raise
        raise ImportError(
            f"pyllamaopt's compiled engine (pyllamaopt._core) is not in {__file__.rsplit('/', 1)[0]}: that is a "
            "source tree, which Python imports before the installed package when it is the current directory. Run "
            "from another directory, or install the package first (pip install .)") from exc


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "__version__"})


def build_info() -> dict[str, object]:
    """Versions, the pinned llama.cpp commit and the CPU features this build uses."""
    return dict(_engine_module("._core").build_info())


__all__ = [
    "Chat", "ChatTemplate", "Context", "Generation", "Model", "OptConfig", "PersistEntry", "PersistStore", "Session",
    "Stats", "Token", "TokenLogprob",
    "build_info", "features", "fields",
    "ChatTemplateError", "ConfigError", "ContextOverflowError", "DecodeError", "DeltaError", "FeatureUnavailableError",
    "GrammarError",
    "InvalidArgumentError", "InvalidTokenError", "ModelLoadError", "ModelNotFoundError", "PersistError",
    "PyllamaoptError",
    "SessionClosedError", "SessionEvictedError", "UnenforceableSchemaError", "UnsupportedRegexError",
    "AuthenticationError", "InvariantViolationError", "ServerError", "ServerOverloadedError", "SessionBusyError",
]
