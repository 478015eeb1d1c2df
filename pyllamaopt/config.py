"""OptConfig: the optimization layer's configuration and where each value came from.

Values are resolved in order: compile-time default -> ``LLAMA_OPT_*`` environment -> explicit
arguments. Parsing and validation happen in the engine (cpp/base/config.cpp), so the CLI, the
library and the C++ tests agree on what is valid.
"""
from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import _core
from .errors import ConfigError

# LLAMA_OPT_* variables read by the CLI rather than by the optimization layer.
CLI_VARIABLES: dict[str, str] = {
    "LLAMA_OPT_MODEL": "model path or name used by the CLI (default: gemma3-270m)",
    "LLAMA_OPT_N_CTX": "context size used by the CLI (default: 4096)",
    "LLAMA_OPT_THREADS": "threads used by the CLI (default: all hardware threads)",
    "LLAMA_OPT_VERBOSE": "1 prints llama.cpp's log to stderr",
    "LLAMA_OPT_SERVE_HOST": "address `pyllamaopt serve` binds (default: 127.0.0.1)",
    "LLAMA_OPT_SERVE_PORT": "port of `pyllamaopt serve` (default: 8080)",
    "LLAMA_OPT_SERVE_GRPC_PORT": "gRPC port of `pyllamaopt serve` (default: no gRPC)",
    "LLAMA_OPT_SERVE_API_KEY": "API key `pyllamaopt serve` requires (needed to bind a non-loopback address)",
    "LLAMA_OPT_SERVE_TLS_CERT": "PEM certificate (chain) `pyllamaopt serve` presents: HTTPS and gRPC over TLS",
    "LLAMA_OPT_SERVE_TLS_KEY": "PEM private key of LLAMA_OPT_SERVE_TLS_CERT",
    "LLAMA_OPT_SERVE_MAX_SESSIONS": "protocol sessions `pyllamaopt serve` keeps open (default: 16)",
    "LLAMA_OPT_SERVE_SESSION_TTL": "seconds an idle protocol session is kept (default: 1800)",
    "LLAMA_OPT_SERVE_CHAT_TEMPLATE_FILE": "jinja chat template `pyllamaopt serve` renders chats with (default: the GGUF's)",
    "LLAMA_OPT_SERVE_JSON_WHITESPACE": "layout of `pyllamaopt serve`'s JSON answers: indented (default), spaced, "
                                       "compact or free",
}


@dataclass(frozen=True)
class Field:
    """One configurable value."""

    name: str
    env: str
    type: str  # "bool", "int", "float" or "str"
    min: float
    max: float
    help: str
    choices: str  # "a|b|c": a "str" field taking one of these ("|a|b": or "", not set); "": any text (a path)
    default: Any


@dataclass(frozen=True)
class Feature:
    """One optimization and its state in this build."""

    name: str
    cmake_switch: str
    enabled_field: str
    tier: int
    compiled: bool
    implemented: bool
    no_effect: str  # not implemented: why turning it on does nothing, with the numbers ("" if implemented)


def fields() -> list[Field]:
    return [Field(**f) for f in _core.fields()]


def features() -> list[Feature]:
    return [Feature(**f) for f in _core.features()]


def switches_without_effect(config: OptConfig) -> list[Feature]:
    """The features turned on in `config` that do nothing (measured not to pay, or not built)."""
    values = config.as_dict()
    return [f for f in features() if f.no_effect and values[f.enabled_field]]


_FIELDS = {f.name: f for f in fields()}
_PATH_VARIABLES = {f.env for f in _FIELDS.values() if f.type == "str" and not f.choices}  # persist_dir, a draft model: "~/..."


def _config_error(message: str, variable: str) -> ConfigError:
    error = ConfigError(message)
    error.variable = variable
    return error


def _is_text(value: str) -> bool:
    """Whether the engine can take it: a str whose characters are all Unicode scalars (a variable
    or a path that was not valid UTF-8 comes to Python with lone surrogates in it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def opt_variables(environment: Mapping[str, str]) -> dict[str, str]:
    """The LLAMA_OPT_* variables the engine reads (no others: the rest of the environment, secrets
    and the CLI's own variables included, never reaches it or its messages)."""
    chosen = {}
    for name, value in environment.items():
        if name.startswith("LLAMA_OPT_") and name not in CLI_VARIABLES:
            if not (_is_text(name) and _is_text(value)):
                raise _config_error(f"{name.encode('utf-8', 'replace').decode()}: its value is not valid UTF-8 "
                                    "text; set it again in UTF-8, or unset it", name)
            chosen[name] = os.path.expanduser(value) if name in _PATH_VARIABLES else value
    return chosen


def _as_text(field: Field, value: Any) -> str:
    """Check a Python value's type for `field` and turn it into the engine's text form."""
    if field.type == "bool":
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
            return "1" if value else "0"
    elif field.type == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    elif field.type == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return repr(float(value))
    elif isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if isinstance(text, str) and _is_text(text) and "\0" not in text:
            # the other text options are paths: "~/kv" is the home's, as in a shell
            return text if field.choices else os.path.expanduser(text)
        raise _config_error(f"{field.name}={value!r}: not valid UTF-8 text (or holds a NUL character)", field.name)
    raise _config_error(f"{field.name}={value!r}: expected a value of type {field.type}", field.name)


class OptConfig:
    """Configuration of the optimization layer.

    >>> OptConfig(block_size=32).block_size
    32
    >>> OptConfig(block_size=32).source("block_size")
    'argument'

    ``env`` defaults to ``os.environ``; pass ``{}`` to ignore the environment.
    """

    def __init__(self, env: Mapping[str, str] | None = None, **values: Any) -> None:
        environment = os.environ if env is None else env
        # the engine's object, named _core as Model's, Context's and Session's are: the package's other
        # wrappers hand it to the engine (with the _core module, the only private names used across modules)
        self._core = _core.Settings.from_env(opt_variables(environment), list(CLI_VARIABLES))
        for name, value in values.items():
            self.set(name, value)

    def set(self, name: str, value: Any) -> None:
        """Set one value (source: argument). Raises ConfigError if it is not valid."""
        field = _FIELDS.get(name)
        if field is None:
            close = difflib.get_close_matches(name, _FIELDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise _config_error(f"unknown configuration option {name!r}{hint}", name)
        self._core.set(name, _as_text(field, value), "argument")

    def source(self, name: str) -> str:
        """Where the value came from: 'default', 'environment' or 'argument'."""
        if name not in _FIELDS:
            raise _config_error(f"unknown configuration option {name!r}", name)
        return self._core.source_of(name)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._core.values())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in _FIELDS:
            raise AttributeError(name)
        return self._core.values()[name]

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.as_dict().items() if self.source(k) != "default"}
        return f"OptConfig({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def table(self) -> list[tuple[str, Any, str, str]]:
        """(name, value, source, variable) for every field."""
        values = self.as_dict()
        return [(f.name, values[f.name], self.source(f.name), f.env) for f in _FIELDS.values()]
