"""What Session.generate's arguments become for the engine: a checked `_core.Sampling`, the
output's grammar and its token budget. Every value is checked here, before anything runs, with an
InvalidArgumentError that names it (the caller may pass anything)."""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from . import _core
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .grammar import SchemaGrammar


def _real(value: object) -> float:
    """`value` as a float; NaN for what is not a real number (bool included)."""
    return math.nan if isinstance(value, bool) or not isinstance(value, numbers.Real) else float(value)


def _is_count(value: object) -> bool:
    """Whether `value` is an int in [0, 2**31) (bool is refused: a True top_k is a mistake, not 1)."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and 0 <= int(value) < 2**31


def check_max_tokens(max_tokens: object, n_ctx: int) -> None:
    """InvalidArgumentError unless `max_tokens` is None or an int in [0, n_ctx]."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or not 0 <= max_tokens <= n_ctx):
        raise InvalidArgumentError(
            f"max_tokens must be between 0 and the context size {n_ctx} (or None for 'until done'), "
            f"got {max_tokens!r}")


def budget(max_tokens: int | None, room: int) -> int:
    """The tokens an output may take: what schema_fit_max_tokens closes a grammar's output within."""
    return room if max_tokens is None else min(max_tokens, room)


def _check_sampling(temperature: object, top_k: object, top_p: object, min_p: object) -> None:
    """InvalidArgumentError for a sampling value out of its range."""
    for name, value, low_open, high in (("temperature", temperature, False, math.inf), ("top_p", top_p, True, 1.0),
                                        ("min_p", min_p, False, 1.0)):
        x = _real(value)
        ok = (0 < x if low_open else 0 <= x) and x <= high and math.isfinite(x)
        if not ok:
            where = {"temperature": "a finite number >= 0 (0: greedy)",
                     "top_p": "in (0, 1] (1: off)", "min_p": "in [0, 1] (0: off)"}[name]
            raise InvalidArgumentError(f"{name} must be {where}, got {value!r}")
    if not _is_count(top_k):
        raise InvalidArgumentError(f"top_k must be an integer >= 0 (0: off), got {top_k!r}")


def _penalties(sampling: _core.Sampling, repeat: object, frequency: object, presence: object, last_n: object) -> None:
    """The repetition penalties into `sampling`; InvalidArgumentError for a value out of its range."""
    for name, value in (("frequency_penalty", frequency), ("presence_penalty", presence)):
        if not math.isfinite(_real(value)):
            raise InvalidArgumentError(f"{name} must be a finite number (0: off), got {value!r}")
    if not (math.isfinite(_real(repeat)) and _real(repeat) > 0):
        raise InvalidArgumentError(f"repeat_penalty must be a finite number > 0 (1: off), got {repeat!r}")
    if not _is_count(last_n):
        raise InvalidArgumentError(f"repeat_last_n must be an integer >= 0 (0: off), got {last_n!r}")
    sampling.repeat_penalty, sampling.frequency_penalty, sampling.presence_penalty, sampling.repeat_last_n = (
        _real(repeat), _real(frequency), _real(presence), int(cast(int, last_n)))


def _logit_bias(bias: object, n_vocab: int) -> list[tuple[int, float]]:
    """A {token id: bias} mapping as (token, bias) pairs; InvalidArgumentError naming a bad entry."""
    if not isinstance(bias, Mapping):
        raise InvalidArgumentError(f"logit_bias must map token ids to biases, got {bias!r}")
    pairs = []
    for token, value in bias.items():
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or not 0 <= int(token) < n_vocab:
            raise InvalidArgumentError(f"logit_bias: token {token!r} is not a token id of this model (0..{n_vocab - 1})")
        if not math.isfinite(_real(value)):
            raise InvalidArgumentError(f"logit_bias: the bias of token {token} must be a finite number, got {value!r}")
        pairs.append((int(token), _real(value)))
    return pairs


def sampling_settings(*, temperature: float, top_k: int, top_p: float, min_p: float, seed: int | None,
                      logit_bias: Mapping[int, float] | None, frequency_penalty: float, presence_penalty: float,
                      repeat_penalty: float, repeat_last_n: int, n_vocab: int) -> _core.Sampling:
    """The engine's sampling settings from Session.generate's arguments (defaults: its signature)."""
    if seed is not None and not (isinstance(seed, int) and 0 <= seed < 0xFFFFFFFF):
        raise InvalidArgumentError(f"seed must be an integer in [0, 2**32 - 1), got {seed!r}")
    _check_sampling(temperature, top_k, top_p, min_p)
    settings = _core.Sampling()
    settings.temperature, settings.top_k, settings.top_p, settings.min_p, settings.seed = (
        float(temperature), int(top_k), float(top_p), float(min_p), seed)
    settings.logit_bias = _logit_bias(logit_bias or {}, n_vocab)
    _penalties(settings, repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n)
    return settings


def output_grammar(grammar: str | None, json_schema: dict | bool | SchemaGrammar | None,
                   strict: bool) -> tuple[str, SchemaGrammar | None]:
    """The GBNF the output must match ("" for none) and the compiled schema it came from, if any;
    GrammarError (an invalid grammar or schema) or InvalidArgumentError before anything runs."""
    if grammar is not None and json_schema is not None:
        raise InvalidArgumentError("give grammar or json_schema, not both")
    schema: SchemaGrammar | None = None
    if json_schema is not None:
        from .grammar import SchemaGrammar, compile_json_schema  # (jsonschema loads only when needed)

        schema = json_schema if isinstance(json_schema, SchemaGrammar) else compile_json_schema(
            json_schema, strict=strict)
        grammar = schema.gbnf
    if grammar is not None and (not isinstance(grammar, str) or not grammar.strip()):
        raise InvalidArgumentError("grammar must be a non-empty GBNF string")
    if grammar is not None:
        from .grammar.limits import check_gbnf_limits

        check_gbnf_limits(grammar)  # (the parser recurses: a deep one killed the process)
    return grammar or "", schema


TRIGGER_KINDS = ("word", "pattern", "pattern_full", "token")


def trigger_settings(triggers: Sequence[tuple[str, str | int]] | None, grammar: str,
                     n_vocab: int) -> list[_core.GrammarTrigger]:
    """A lazy grammar's triggers, (kind, value) pairs: ("word", text), ("pattern", regex),
    ("pattern_full", regex) or ("token", token id); InvalidArgumentError naming a bad one, or for
    triggers without a grammar (an invalid regex is the engine's GrammarError)."""
    if not triggers:
        return []
    if not grammar:
        raise InvalidArgumentError("grammar_triggers start a grammar: give one with grammar=")
    out = []
    for i, trigger in enumerate(triggers):
        if not (isinstance(trigger, (tuple, list)) and len(trigger) == 2 and trigger[0] in TRIGGER_KINDS):
            raise InvalidArgumentError(f"grammar_triggers[{i}] must be (kind, value) with kind one of "
                                       f"{', '.join(TRIGGER_KINDS)}, got {trigger!r}")
        kind, value = trigger
        if kind == "token":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_vocab:
                raise InvalidArgumentError(f"grammar_triggers[{i}]: a 'token' trigger's value is a token id of this "
                                           f"model (0..{n_vocab - 1}), got {value!r}")
            out.append(_core.GrammarTrigger("token", "", value))
        elif not isinstance(value, str) or not value:
            raise InvalidArgumentError(f"grammar_triggers[{i}]: a {kind!r} trigger's value is a non-empty string, "
                                       f"got {value!r}")
        else:
            out.append(_core.GrammarTrigger(kind, value))
    return out


def check_grammar_prefill(prefill: object, grammar: str, triggers: Sequence[_core.GrammarTrigger]) -> None:
    """InvalidArgumentError for a grammar_prefill that is not text, or without a grammar applied from
    the output's start (none, or a lazy one) to take it."""
    if not isinstance(prefill, str):
        raise InvalidArgumentError(f"grammar_prefill is text (a chat template's generation prompt), got {prefill!r}")
    if prefill and (not grammar or triggers):
        raise InvalidArgumentError("grammar_prefill is text a grammar takes before the output: give a grammar= "
                                   "without grammar_triggers (llama.cpp prefills no lazy grammar)")
