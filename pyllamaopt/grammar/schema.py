"""Reading a JSON Schema: the keywords (supported, annotations, refused with advice), their
values checked, the types a schema declares, local $ref resolution, numeric bounds, and the
errors."""
from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any, Callable
from urllib.parse import unquote

from ..errors import GrammarError, UnenforceableSchemaError
from .json_values import json_kind
from .formats import format_pattern
from .refs import follow
from .regex import parse_regex


# keywords that only annotate (known to JSON Schema or common in the wild): ignored. Any other
# keyword not in SUPPORTED_KEYWORDS / UNSUPPORTED_KEYWORDS is an annotation too (JSON Schema: unknown keywords
# are annotations), unless it looks like a typo of a keyword that constrains (_typo_of).


_ANNOTATIONS = frozenset({
    "title", "description", "examples", "example", "default", "$schema", "$id", "id", "$comment",
    "deprecated", "readOnly", "writeOnly", "discriminator", "contentMediaType", "contentEncoding",
    "contentSchema", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary", "$defs",
    "definitions",
})


SUPPORTED_KEYWORDS = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "unevaluatedProperties",
    "minProperties", "maxProperties", "items", "prefixItems", "additionalItems", "unevaluatedItems",
    "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf", "allOf", "$ref", "minLength",
    "maxLength", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "pattern", "patternProperties",
})


# known keywords the converter cannot express, and what to do instead


UNSUPPORTED_KEYWORDS = {
    "propertyNames": "drop it and list the keys under 'properties'",
    "dependentRequired": "make the properties required, or split the alternatives with 'anyOf'",
    "dependentSchemas": "split the alternatives with 'anyOf'",
    "dependencies": "make the properties required, or split the alternatives with 'anyOf'",
    "if": "split the cases with 'anyOf'", "then": "split the cases with 'anyOf'",
    "else": "split the cases with 'anyOf'",
    "not": "a grammar cannot exclude a sub-language; list what is allowed instead (enum, anyOf)",
    "contains": "describe the items with 'items' or 'prefixItems'",
    "minContains": "describe the items with 'items' or 'prefixItems'",
    "maxContains": "describe the items with 'items' or 'prefixItems'",
    "$dynamicRef": "use a plain '$ref' to '#/$defs/...'",
    "$recursiveRef": "use a plain '$ref' to '#/$defs/...'",
    "nullable": "this is OpenAPI 3.0, not JSON Schema: write \"type\": [..., \"null\"]",
}


def constrains(key: str) -> bool:
    """Whether a keyword constrains the value (else it annotates, and is ignored)."""
    return key in SUPPORTED_KEYWORDS or key in UNSUPPORTED_KEYWORDS


def _osa_distance(a: str, b: str) -> int:
    """Edit distance with adjacent transpositions (optimal string alignment)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


@functools.lru_cache(maxsize=4096)
def _typo_of(key: str) -> str | None:
    """The constraining keyword ``key`` is likely a misspelling of, if any: the same but for
    case or a trailing ':' / '"' / space; for keywords of 6 or 7 letters one edit away, for
    longer ones two (an edit: a letter inserted, dropped, changed, or two swapped); for 5-letter
    ones (items, const) one edit but no letter dropped (`cost` is a word); for short ones (type,
    enum, not, if...) only two letters swapped. Keys starting with '_', '$', '@' or
    'x-' are deliberate extensions, never typos."""
    if key[:1] in ("_", "$", "@") or key.startswith("x-"):
        return None
    bare = key.rstrip(': "')
    for word in sorted(SUPPORTED_KEYWORDS | set(UNSUPPORTED_KEYWORDS)):
        if word.startswith("$"):
            continue
        if bare.lower() == word.lower():
            return word
        n = len(word)
        if n <= 4:
            if len(bare) == n and sorted(bare) == sorted(word) and _osa_distance(bare, word) == 1:
                return word
        elif (n > 5 or len(bare) >= n) and abs(len(bare) - n) <= 2 \
                and _osa_distance(bare, word) <= (1 if n <= 7 else 2):
            return word
    return None


OBJECT_KEYWORDS = ("properties", "required", "additionalProperties", "unevaluatedProperties",
                   "minProperties", "maxProperties", "patternProperties")


ARRAY_KEYWORDS = ("items", "prefixItems", "additionalItems", "unevaluatedItems", "minItems", "maxItems",
                  "uniqueItems")


STRING_KEYWORDS = ("minLength", "maxLength", "format", "pattern")


NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


class Unsatisfiable(Exception):
    """No value matches this (sub)schema; an enclosing anyOf / optional property may drop it."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")


def schema_error(path: str, msg: str) -> GrammarError:
    return GrammarError(f"JSON Schema at {path}: {msg}")


def unenforceable(path: str, keyword: str, msg: str) -> UnenforceableSchemaError:
    """A constraint a grammar cannot enforce: refused with strict=True, else left to the check
    of the finished output."""
    return UnenforceableSchemaError(f"JSON Schema at {path}: {msg}", keyword, path)


#: what the converter does with an UnenforceableSchemaError: raise it (strict) or note it
Relax = Callable[[UnenforceableSchemaError], None]
#: whether a value is valid against a subschema of the schema being converted (jsonschema)
Matches = Callable[[Any, Any], bool]


def refuse(err: UnenforceableSchemaError) -> None:
    raise err


def kinds_of_type(t: str) -> set[str]:
    return {"integer", "fraction"} if t == "number" else {t}


def check_json(value: Any, path: str = "#", ancestors: frozenset[int] = frozenset()) -> None:
    """GrammarError unless ``value`` is JSON (what json.loads gives): dicts with str keys, lists,
    str, finite numbers, bools and None, and no container inside itself (a Python caller can
    pass anything; a sub-schema used in two places is fine)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise schema_error(path, f"{value!r} is not a JSON number")
    if isinstance(value, (dict, list)):
        if id(value) in ancestors:
            raise schema_error(path, "the schema contains itself (a JSON Schema is a tree: use $ref)")
        if isinstance(value, dict) and not all(isinstance(key, str) for key in value):
            raise schema_error(path, "an object's keys must be strings, got "
                                     f"{[k for k in value if not isinstance(k, str)]!r}")
        inside = ancestors | {id(value)}
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            check_json(item, f"{path}/{pointer_escape(str(key))}", inside)
    elif value is not None and not isinstance(value, (bool, int, float, str)):
        raise schema_error(path, f"a {type(value).__name__} is not a JSON value")


def as_count(value: Any, path: str, key: str) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
            or (isinstance(value, float) and not value.is_integer())):
        raise schema_error(path, f"'{key}' must be a non-negative integer, got {value!r}")
    return int(value)


def as_number(value: Any, path: str, key: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float)
                                                                          and not math.isfinite(value)):
        raise schema_error(path, f"'{key}' must be a number, got {value!r}")  # (math.isfinite(10**400) would overflow)
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def schema_types(schema: dict, path: str) -> list[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    types = [t] if isinstance(t, str) else t
    if not isinstance(types, list) or not types or any(not isinstance(x, str) for x in types):
        raise schema_error(path, f"'type' must be a type name or a non-empty list of them, got {t!r}")
    for x in types:
        if x not in TYPES:
            raise schema_error(path, f"unknown type {x!r}; the JSON Schema types are {', '.join(TYPES)}")
    if len(set(types)) != len(types):
        raise schema_error(path, f"'type' lists a type twice: {t!r}")
    return list(types)


def check_keywords(schema: dict, path: str, relax: Relax) -> None:
    """The keywords' values checked. A keyword that looks like a misspelling is refused (strict)
    or, relaxed, ignored as JSON Schema ignores unknown keywords (jsonschema's check too)."""
    for key in schema:
        if not isinstance(key, str):
            raise schema_error(path, f"keyword {key!r} is not a string")
        if key in SUPPORTED_KEYWORDS or key in _ANNOTATIONS:
            continue
        if key in UNSUPPORTED_KEYWORDS:
            continue  # the converter refuses or relaxes it
        meant = _typo_of(key)
        if meant is not None:
            relax(unenforceable(path, key, f"unknown keyword '{key}' looks like a misspelling of '{meant}', which "
                                "would then not be enforced: correct it (or prefix it with 'x-' if it only "
                                "annotates)"))
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema and (not isinstance(schema[key], list) or not schema[key]):
            raise schema_error(path, f"'{key}' must be a non-empty list of schemas")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise schema_error(path, "'enum' must be a list of values")
    if "required" in schema:
        req = schema["required"]
        if not isinstance(req, list) or any(not isinstance(x, str) for x in req) or len(set(req)) != len(req):
            raise schema_error(path, "'required' must be a list of distinct property names")
    if "patternProperties" in schema and (not isinstance(schema["patternProperties"], dict)
                                          or any(not isinstance(k, str) for k in schema["patternProperties"])):
        raise schema_error(path, "'patternProperties' must be an object mapping regular expressions to schemas")
    if "properties" in schema and (not isinstance(schema["properties"], dict)
                                   or any(not isinstance(k, str) for k in schema["properties"])):
        raise schema_error(path, "'properties' must be an object mapping names to schemas")
    for key in ("additionalProperties", "unevaluatedProperties", "additionalItems", "unevaluatedItems"):
        if key in schema and not isinstance(schema[key], (bool, dict)):
            raise schema_error(path, f"'{key}' must be a schema (an object or a boolean)")
    for key in ("not", "if", "then", "else", "contains", "propertyNames"):
        if key in schema and not isinstance(schema[key], (bool, dict)):
            raise schema_error(path, f"'{key}' must be a schema (an object or a boolean)")
    for key in ("dependentRequired", "dependentSchemas", "dependencies"):
        # property name -> the names it requires (dependentRequired), a schema (dependentSchemas), or either
        for name, dep in (schema[key].items() if isinstance(schema.get(key), dict) else ()):
            names_ok = key != "dependentSchemas" and isinstance(dep, list) and all(isinstance(x, str) for x in dep)
            if not names_ok and (key == "dependentRequired" or not isinstance(dep, (bool, dict))):
                raise schema_error(path, f"'{key}' of {name!r} must be "
                                   + {"dependentRequired": "a list of property names", "dependentSchemas": "a schema",
                                      "dependencies": "a list of property names or a schema"}[key])
        if key in schema and not isinstance(schema[key], dict):
            raise schema_error(path, f"'{key}' must be an object mapping property names to what they bring")
    if "items" in schema and not isinstance(schema["items"], (bool, dict, list)):
        raise schema_error(path, "'items' must be a schema (an object or a boolean)")
    if "prefixItems" in schema and not isinstance(schema["prefixItems"], list):
        raise schema_error(path, "'prefixItems' must be a list of schemas")
    for key in ("format", "pattern", "$ref"):
        if key in schema and not isinstance(schema[key], str):
            raise schema_error(path, f"'{key}' must be a string, got {schema[key]!r}")
    if "uniqueItems" in schema and not isinstance(schema["uniqueItems"], bool):
        raise schema_error(path, "'uniqueItems' must be a boolean")
    for key in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
        if key in schema:
            as_count(schema[key], path, key)
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        if key in schema and not (key.startswith("exclusive") and isinstance(schema[key], bool)):
            as_number(schema[key], path, key)
    for key in ("$defs", "definitions"):
        if key in schema and not isinstance(schema[key], dict):
            raise schema_error(path, f"'{key}' must be an object mapping names to schemas")


def resolve(root: Any, ref: Any, path: str) -> Any:
    if not isinstance(ref, str):
        raise schema_error(path, f"'$ref' must be a string, got {ref!r}")
    if not ref.startswith("#"):
        raise unenforceable(path, "$ref", f"'$ref': {ref!r} refers to another document; only references into the same "
                            "schema are resolved ('#/$defs/Name', '#anchor', or a '$id' the schema declares): "
                            "inline the referenced schema under '$defs'")
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        raise schema_error(path, f"'$ref': {ref!r} names an anchor that no subschema declares ('$anchor', or "
                           "'$id'/'id' \"#name\"); declare it or use a JSON pointer such as '#/$defs/Name'")
    try:
        return follow(root, fragment)
    except KeyError as e:
        raise schema_error(path, f"'$ref': {ref!r} does not resolve: no {e.args[0]!r} in the schema") from None


def pointer_escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def bounds(schema: dict, path: str) -> tuple:
    lo: tuple | None = None  # (value, exclusive)
    hi: tuple | None = None

    def tighter(cur: tuple | None, new: tuple, lower: bool) -> tuple:
        if cur is None:
            return new
        if new[0] != cur[0]:
            return new if (new[0] > cur[0]) == lower else cur
        return new if new[1] else cur

    emin, emax = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if "minimum" in schema:
        lo = (as_number(schema["minimum"], path, "minimum"), emin is True)
    if "maximum" in schema:
        hi = (as_number(schema["maximum"], path, "maximum"), emax is True)
    for key, val, lower in (("exclusiveMinimum", emin, True), ("exclusiveMaximum", emax, False)):
        if isinstance(val, bool):
            if val and ("minimum" if lower else "maximum") not in schema:
                raise schema_error(path, f"'{key}': true needs '{'minimum' if lower else 'maximum'}'")
        elif val is not None:
            b = (as_number(val, path, key), True)
            if lower:
                lo = tighter(lo, b, True)
            else:
                hi = tighter(hi, b, False)
    return lo, hi


# keywords beside enum/const that filter the values


VALUE_CHECKS = frozenset({"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                          "required", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern",
                          "format"})


def value_ok(v: Any, schema: dict, path: str) -> bool:
    """Whether an enum/const value satisfies the VALUE_CHECKS keywords of the schema."""
    kind = json_kind(v)
    if kind == "string":
        n = len(v)
        for source in (schema.get("pattern"), format_pattern(schema.get("format"))):
            try:
                regex = parse_regex(source) if source is not None else None
            except GrammarError:  # an untranslatable pattern: refused or relaxed by the converter
                continue
            if regex is not None and not regex.search(v):
                return False
        return schema.get("minLength", 0) <= n and ("maxLength" not in schema or n <= schema["maxLength"])
    if kind == "array":
        n = len(v)
        return schema.get("minItems", 0) <= n and ("maxItems" not in schema or n <= schema["maxItems"])
    if kind == "object":
        n = len(v)
        return (schema.get("minProperties", 0) <= n and ("maxProperties" not in schema or n <= schema["maxProperties"])
                and all(k in v for k in schema.get("required", ())))
    if kind in ("integer", "fraction"):
        x = Fraction(v)
        for key, ok in (("minimum", lambda b: x >= b), ("maximum", lambda b: x <= b),
                        ("exclusiveMinimum", lambda b: x > b), ("exclusiveMaximum", lambda b: x < b)):
            bound = schema.get(key)
            if isinstance(bound, bool):  # draft 4
                if bound and key == "exclusiveMinimum" and "minimum" in schema:
                    if not x > as_number(schema["minimum"], path, "minimum"):
                        return False
                if bound and key == "exclusiveMaximum" and "maximum" in schema:
                    if not x < as_number(schema["maximum"], path, "maximum"):
                        return False
            elif bound is not None and not ok(as_number(bound, path, key)):
                return False
    return True
