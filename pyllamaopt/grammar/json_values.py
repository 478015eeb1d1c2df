"""JSON values as the converter sees them: their text, their kind, and a key under
which JSON-equal values are equal."""
from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from typing import Any


def json_text(value: Any, spaced: bool = False) -> str:
    """JSON text of a value (key order kept), compact or with json.dumps's ", " and ": ";
    lone surrogates escaped."""
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(value, separators=separators, ensure_ascii=False, allow_nan=False)
    return re.sub("[\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", text)


def json_kind(value: Any) -> str | None:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return "integer" if value.is_integer() else "fraction"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return None


ALL_KINDS = frozenset({"null", "boolean", "integer", "fraction", "string", "array", "object"})


def json_key(value: Any) -> Any:
    """A hashable key under which JSON-equal values (1 and 1.0) are equal."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, (int, float)):
        finite = isinstance(value, int) or math.isfinite(value)  # (math.isfinite(10**400) would overflow)
        return ("number", Fraction(value)) if finite else ("?", repr(value))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(json_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, json_key(v)) for k, v in value.items()))
    return ("?", repr(value))
