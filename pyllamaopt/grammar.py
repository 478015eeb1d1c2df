"""JSON Schema → GBNF (llama.cpp's grammar format), in pure Python.

    >>> from pyllamaopt.grammar import json_schema_to_gbnf
    >>> print(json_schema_to_gbnf({"type": "object", "properties": {"ok": {"type": "boolean"}},
    ...                            "required": ["ok"]}), end="")
    root ::= "{\\"ok\\":" boolean "}"
    boolean ::= "true" | "false"

The grammar accepts one *canonical* spelling of each instance (compact JSON, properties in
schema order, no free whitespace), so that as many tokens as possible are forced by the
grammar — the engine takes forced tokens without computing logits. Every string the grammar
accepts is valid against the schema; a schema (or keyword) the converter cannot express
exactly raises :class:`~pyllamaopt.errors.GrammarError` instead of being loosened.
The supported keywords and the canonical form: docs/structured-output.md.
"""
from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from typing import Any, Callable, Union
from urllib.parse import unquote

from .errors import GrammarError

__all__ = ["JSON_GBNF", "json_schema_to_gbnf", "SUPPORTED_FORMATS"]

# --------------------------------------------------------------------------------------
# limits of the canonical form

#: integers (and the integer part of numbers) have at most this many digits
MAX_INT_DIGITS = 16
#: at most this many digits after the decimal point
MAX_FRAC_DIGITS = 20
#: at most this many digits in an exponent
MAX_EXP_DIGITS = 3
#: next to an exclusive bound, a number has at most this many significant digits (a double
#: keeps 15: a longer decimal could be read as the bound itself)
_SAFE_DIGITS = 15
#: compact=False: at most this many whitespace characters between two tokens
MAX_WS = 24
#: string formats with a precise grammar
SUPPORTED_FORMATS = ("date", "time", "date-time", "uuid")

# llama.cpp turns S{m,n} with n > 2000 into S{m,} (and refuses m > 2000); longer repetitions
# are written as chunks of _CHUNK
_LLAMA_REP_LIMIT = 2000
_CHUNK = 1000
_INT_MAX = 10 ** MAX_INT_DIGITS - 1

# keywords that only annotate: ignored
_ANNOTATIONS = frozenset({
    "title", "description", "examples", "example", "default", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "discriminator", "contentMediaType", "contentEncoding",
    "contentSchema", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary", "$defs",
    "definitions",
})
_SUPPORTED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "unevaluatedProperties",
    "minProperties", "maxProperties", "items", "prefixItems", "additionalItems", "unevaluatedItems",
    "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf", "allOf", "$ref", "minLength",
    "maxLength", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
})
# known keywords the converter cannot express, and what to do instead
_UNSUPPORTED = {
    "pattern": "regular expressions are not converted; drop 'pattern' and check the string after "
               "generation, or list the allowed values with 'enum'",
    "patternProperties": "drop it and list the keys under 'properties', or use 'additionalProperties' "
                         "with a schema",
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
_OBJECT_KEYWORDS = ("properties", "required", "additionalProperties", "unevaluatedProperties",
                    "minProperties", "maxProperties")
_ARRAY_KEYWORDS = ("items", "prefixItems", "additionalItems", "unevaluatedItems", "minItems", "maxItems",
                   "uniqueItems")
_STRING_KEYWORDS = ("minLength", "maxLength", "format")
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


class _Unsat(Exception):
    """No value matches this (sub)schema; an enclosing anyOf / optional property may drop it."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")


def _err(path: str, msg: str) -> GrammarError:
    return GrammarError(f"JSON Schema at {path}: {msg}")


# --------------------------------------------------------------------------------------
# grammar expressions: small immutable trees, rendered to GBNF at the end
#   ("lit", text) ("cls", "[...]") ("ref", name) ("seq", items) ("alt", items) ("rep", x, lo, hi)

Node = tuple
EMPTY: Node = ("seq", ())


def _lit(text: str) -> Node:
    return ("lit", text) if text else EMPTY


def _seq(*items: Node) -> Node:
    out: list[Node] = []
    for item in items:
        for part in (item[1] if item[0] == "seq" else (item,)):
            if out and out[-1][0] == "lit" and part[0] == "lit":
                out[-1] = ("lit", out[-1][1] + part[1])
            else:
                out.append(part)
    return out[0] if len(out) == 1 else ("seq", tuple(out))


def _alt(*items: Node) -> Node:
    """Alternation; an empty alternative makes the whole optional."""
    out: list[Node] = []
    empty = False
    for item in items:
        for part in (item[1] if item[0] == "alt" else (item,)):
            if part == EMPTY:
                empty = True
            elif part not in out:
                out.append(part)
    if not out:
        return EMPTY
    node = out[0] if len(out) == 1 else ("alt", tuple(out))
    return _opt(node) if empty else node


def _r(node: Node, lo: int, hi: int | None) -> Node:
    """Repetition within llama.cpp's limits (callers make sure of them)."""
    if hi == 0 or node == EMPTY:
        return EMPTY
    if lo == 1 and hi == 1:
        return node
    if node[0] == "rep" and node[2] == 0 and node[3] == 1 and lo == 0 and hi == 1:
        return node
    return ("rep", node, lo, hi)


def _opt(node: Node) -> Node:
    return _r(node, 0, 1)


def _is_atom(node: Node) -> bool:
    return node[0] in ("lit", "cls", "ref")


def _gbnf_char(c: str, in_class: bool) -> str:
    o = ord(c)
    if c == "\\":
        return "\\\\"
    if c == '"' and not in_class:
        return '\\"'
    if in_class and c in "[]-^\"":
        return f"\\x{o:02X}"
    if c == "\n":
        return "\\n"
    if c == "\r":
        return "\\r"
    if c == "\t":
        return "\\t"
    if o < 0x20 or o == 0x7F:
        return f"\\x{o:02X}"
    if 0xD800 <= o <= 0xDFFF or (0x80 <= o < 0xA0) or c in "\u2028\u2029\ufeff":
        return f"\\u{o:04X}"
    return c


def _render(node: Node, ctx: str = "top") -> str:
    kind = node[0]
    if kind == "lit":
        return '"' + "".join(_gbnf_char(c, False) for c in node[1]) + '"'
    if kind in ("cls", "ref"):
        return node[1]
    if kind == "seq":
        if not node[1]:
            return '""'
        text = " ".join(_render(p, "seq") for p in node[1])
        return f"({text})" if ctx == "rep" else text
    if kind == "alt":
        text = " | ".join(_render(p, "alt") for p in node[1])
        return text if ctx == "top" else f"({text})"
    if kind == "rep":
        child, lo, hi = node[1], node[2], node[3]
        inner = _render(child, "rep")
        if (child[0] == "lit" and len(child[1]) > 1) or child[0] == "rep":
            inner = f"({inner})"
        if (lo, hi) == (0, 1):
            suffix = "?"
        elif (lo, hi) == (0, None):
            suffix = "*"
        elif (lo, hi) == (1, None):
            suffix = "+"
        elif hi is None:
            suffix = f"{{{lo},}}"
        elif lo == hi:
            suffix = f"{{{lo}}}"
        else:
            suffix = f"{{{lo},{hi}}}"
        return inner + suffix
    raise AssertionError(node)


def _walk_refs(node: Node, out: list[str]) -> None:
    kind = node[0]
    if kind == "ref":
        out.append(node[1])
    elif kind in ("seq", "alt"):
        for p in node[1]:
            _walk_refs(p, out)
    elif kind == "rep":
        _walk_refs(node[1], out)


def _nullable(node: Node, nullable: set[str]) -> bool:
    kind = node[0]
    if kind in ("lit", "cls"):
        return False
    if kind == "ref":
        return node[1] in nullable
    if kind == "seq":
        return all(_nullable(p, nullable) for p in node[1])
    if kind == "alt":
        return any(_nullable(p, nullable) for p in node[1])
    return node[2] == 0 or _nullable(node[1], nullable)


def _productive(node: Node, prod: set[str]) -> bool:
    kind = node[0]
    if kind in ("lit", "cls"):
        return True
    if kind == "ref":
        return node[1] in prod
    if kind == "seq":
        return all(_productive(p, prod) for p in node[1])
    if kind == "alt":
        return any(_productive(p, prod) for p in node[1])
    return node[2] == 0 or _productive(node[1], prod)


def _left_refs(node: Node, nullable: set[str], out: set[str]) -> bool:
    """Adds the rules that can start ``node`` to ``out``; returns whether node is nullable."""
    kind = node[0]
    if kind in ("lit", "cls"):
        return False
    if kind == "ref":
        out.add(node[1])
        return node[1] in nullable
    if kind == "seq":
        for p in node[1]:
            if not _left_refs(p, nullable, out):
                return False
        return True
    if kind == "alt":
        result = False
        for p in node[1]:
            result = _left_refs(p, nullable, out) or result
        return result
    return _left_refs(node[1], nullable, out) or node[2] == 0


# --------------------------------------------------------------------------------------
# JSON helpers

_HEX = "[0-9a-fA-F]"


def _json_text(value: Any) -> str:
    """Compact JSON text of a value (key order kept); lone surrogates escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return re.sub("[\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", text)


def _json_kind(value: Any) -> str | None:
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


def _json_key(value: Any) -> Any:
    """A hashable key under which JSON-equal values (1 and 1.0) are equal."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, (int, float)):
        return ("number", Fraction(value)) if math.isfinite(value) else ("?", repr(value))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(_json_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _json_key(v)) for k, v in value.items()))
    return ("?", repr(value))


def _kinds_of_type(t: str) -> set[str]:
    return {"integer", "fraction"} if t == "number" else {t}


_ALL_KINDS = frozenset({"null", "boolean", "integer", "fraction", "string", "array", "object"})


def _sanitize(hint: str) -> str:
    hint = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", hint).lower()
    hint = re.sub(r"[^a-z0-9]+", "-", hint).strip("-")
    return hint or "r"


def _as_count(value: Any, path: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
        raise _err(path, f"'{key}' must be a non-negative integer, got {value!r}")
    return int(value)


def _as_number(value: Any, path: str, key: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _err(path, f"'{key}' must be a number, got {value!r}")
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _schema_types(schema: dict, path: str) -> list[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    types = [t] if isinstance(t, str) else t
    if not isinstance(types, list) or not types or any(not isinstance(x, str) for x in types):
        raise _err(path, f"'type' must be a type name or a non-empty list of them, got {t!r}")
    for x in types:
        if x not in _TYPES:
            raise _err(path, f"unknown type {x!r}; the JSON Schema types are {', '.join(_TYPES)}")
    if len(set(types)) != len(types):
        raise _err(path, f"'type' lists a type twice: {t!r}")
    return list(types)


# --------------------------------------------------------------------------------------
# the converter

class _Converter:
    def __init__(self, root: Any, compact: bool) -> None:
        self.root = root
        self.compact = compact
        self.rules: dict[str, Node | None] = {}   # name -> body (None while being built)
        self.by_body: dict[Node, str] = {}
        self.shared: dict[str, Node] = {}
        self.ref_rules: dict[str, str] = {}
        self.unsat_refs: dict[str, str] = {}

    # ---- rules

    def alloc(self, hint: str) -> str:
        base = _sanitize(hint)
        name, n = base, 1
        while name in self.rules:
            n += 1
            name = f"{base}-{n}"
        self.rules[name] = None
        return name

    def define(self, hint: str, body: Node, name: str | None = None) -> Node:
        if name is not None:
            self.rules[name] = body
            return ("ref", name)
        if body[0] == "ref":
            return body
        if body in self.by_body:
            return ("ref", self.by_body[body])
        name = self.alloc(hint)
        self.rules[name] = body
        self.by_body[body] = name
        return ("ref", name)

    def simple(self, node: Node, hint: str) -> Node:
        """A node llama.cpp may repeat {m,n} times (it counts the rules inside a group)."""
        if _is_atom(node):
            return node
        if node[0] in ("seq", "alt") and all(_is_atom(p) for p in node[1]):
            return node
        return self.define(hint, node)

    def rep(self, node: Node, lo: int, hi: int | None, hint: str) -> Node:
        if hi is not None and hi < lo:
            raise AssertionError((lo, hi))
        if hi == 0 or node == EMPTY:
            return EMPTY
        if lo == 1 and hi == 1:
            return node
        if not _is_atom(node) and max(lo, hi or 0) > 100:
            node = self.define(hint, node)  # llama.cpp counts the rules a repeated group creates
        node = self.simple(node, hint)
        if lo <= _LLAMA_REP_LIMIT and (hi is None or hi <= _LLAMA_REP_LIMIT):
            return _r(node, lo, hi)
        if lo > _LLAMA_REP_LIMIT * _CHUNK or (hi is not None and hi > _LLAMA_REP_LIMIT * _CHUNK):
            raise GrammarError(f"a repetition bound of {hi or lo} is too large for a grammar "
                               f"(at most {_LLAMA_REP_LIMIT * _CHUNK}); lower minLength/maxLength/"
                               "minItems/maxItems")
        chunk = self.define(f"{hint}-x{_CHUNK}", _r(node, _CHUNK, _CHUNK))
        q, r = divmod(lo, _CHUNK)
        mandatory = _seq(_r(chunk, q, q), _r(node, r, r))
        if hi is None:
            return _seq(mandatory, _r(node, 0, None))
        d = hi - lo
        if d <= _LLAMA_REP_LIMIT:
            return _seq(mandatory, _r(node, 0, d))
        a, b = divmod(d, _CHUNK)
        upto = _alt(_seq(_r(chunk, 0, a - 1), _r(node, 0, _CHUNK - 1)), _seq(_r(chunk, a, a), _r(node, 0, b)))
        return _seq(mandatory, upto)

    def shared_rule(self, key: str, build: Callable[[], Node]) -> Node:
        if key not in self.shared:
            self.shared[key] = self.define(key, build())
        return self.shared[key]

    # ---- whitespace and punctuation

    def ws(self) -> Node:
        return self.shared_rule("ws", lambda: _r(("cls", "[ \\t\\n\\r]"), 0, MAX_WS))

    def punct(self, c: str, before: bool, after: bool) -> Node:
        if self.compact:
            return _lit(c)
        return _seq(self.ws() if before else EMPTY, _lit(c), self.ws() if after else EMPTY)

    def bracket(self, open_: str, content: Node, nullable: bool, close: str) -> Node:
        """``open_ content close``; content may be empty if ``nullable``. compact=False: one
        stretch of whitespace where the content would be, else around it."""
        if self.compact:
            return _seq(_lit(open_), _opt(content) if nullable else content, _lit(close))
        ws = self.ws()
        if content == EMPTY:
            return _seq(_lit(open_), ws, _lit(close))
        body = _seq(content, ws)
        return _seq(_lit(open_), ws, _opt(body) if nullable else body, _lit(close))

    def comma(self) -> Node:
        return self.punct(",", True, True)

    def colon(self) -> Node:
        return self.punct(":", True, True)

    # ---- primitives

    def char(self) -> Node:
        def build() -> Node:
            # \uXXXX of one code point: not a surrogate, or a high and a low surrogate together
            hex2 = _r(("cls", _HEX), 2, 2)
            hex4 = _alt(_seq(("cls", "[0-9a-ce-fA-CE-F]"), _r(("cls", _HEX), 3, 3)),
                        _seq(("cls", "[dD]"), ("cls", "[0-7]"), hex2),
                        _seq(("cls", "[dD]"), ("cls", "[89abAB]"), hex2, _lit("\\u"), ("cls", "[dD]"),
                             ("cls", "[c-fC-F]"), hex2))
            return _alt(("cls", '[^"\\\\\\x00-\\x1F]'),
                        _seq(_lit("\\"), _alt(("cls", '["\\\\/bfnrt]'), _seq(_lit("u"), hex4))))
        return self.shared_rule("char", build)

    def string(self) -> Node:
        return self.shared_rule("string", lambda: _seq(_lit('"'), _r(self.char(), 0, None), _lit('"')))

    def boolean(self) -> Node:
        return self.shared_rule("boolean", lambda: _alt(_lit("true"), _lit("false")))

    def uint(self) -> Node:
        return _alt(_lit("0"), _seq(("cls", "[1-9]"), _r(("cls", "[0-9]"), 0, MAX_INT_DIGITS - 1)))

    def integer(self) -> Node:
        return self.shared_rule("integer", lambda: _alt(
            _lit("0"), _seq(_opt(_lit("-")), ("cls", "[1-9]"), _r(("cls", "[0-9]"), 0, MAX_INT_DIGITS - 1))))

    def number(self) -> Node:
        return self.shared_rule("number", lambda: _seq(
            _opt(_lit("-")), self.uint(), self.frac_opt(),
            _opt(_seq(_lit("e"), _opt(("cls", "[-+]")), _r(("cls", "[0-9]"), 1, MAX_EXP_DIGITS)))))

    def frac_opt(self) -> Node:
        return _opt(_seq(_lit("."), _r(("cls", "[0-9]"), 1, MAX_FRAC_DIGITS)))

    def any_value(self) -> Node:
        if "value" in self.shared:
            return self.shared["value"]
        name = self.alloc("value")
        value = ("ref", name)
        self.shared["value"] = value
        obj = self.shared_rule("object", lambda: self.object_body([], self.any_kv(value, None), "object"))
        arr = self.shared_rule("array", lambda: self.array_body([], value, 0, None, "array"))
        self.define("value", _alt(obj, arr, self.string(), self.number(), self.boolean(), _lit("null")), name)
        return value

    def any_kv(self, value: Node, key: Node | None) -> Node:
        return _seq(key or self.string(), self.colon(), value)

    # ---- schemas

    def gen(self, schema: Any, hint: str, path: str) -> Node:
        if schema is True:
            return self.any_value()
        if schema is False:
            raise _Unsat(path, "the schema is 'false'")
        if not isinstance(schema, dict):
            raise _err(path, f"a schema must be an object or a boolean, got {type(schema).__name__}")
        self.check_keywords(schema, path)
        if "$ref" in schema:
            ref = schema["$ref"]
            rest = {k: v for k, v in schema.items() if k != "$ref" and k not in _ANNOTATIONS}
            if rest:  # constraints beside $ref apply as well
                # (they stay the containing schema: unevaluatedProperties sees through the allOf)
                return self.gen({**rest, "allOf": [{"$ref": ref}, *rest.get("allOf", ())]}, hint, path)
            return self.ref(ref, path)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.gen_alternatives(schema, key, hint, path)
        if "allOf" in schema:
            return self.gen(self.merge_all_of(schema, path), hint, path)
        if "enum" in schema or "const" in schema:
            return self.gen_enum(schema, hint, path)
        types = self.types(schema, path)
        if types is None:
            return self.any_value()
        branches = []
        last: _Unsat | None = None
        for t in types:
            try:
                branches.append(self.gen_type(t, schema, hint if len(types) == 1 else f"{hint}-{t}", path))
            except _Unsat as e:
                last = e
        if not branches:
            raise last or _Unsat(path, "no type admits a value")
        if len(branches) == 1:
            return branches[0]
        return self.define(hint, _alt(*branches))

    def check_keywords(self, schema: dict, path: str) -> None:
        for key in schema:
            if not isinstance(key, str):
                raise _err(path, f"keyword {key!r} is not a string")
            if key in _ANNOTATIONS or key in _SUPPORTED or key.startswith("x-"):
                continue
            if key in _UNSUPPORTED:
                raise _err(path, f"keyword '{key}' is not supported: {_UNSUPPORTED[key]}")
            raise _err(path, f"unknown keyword '{key}': the converter cannot tell whether it constrains "
                             "the value. Remove it (or prefix it with 'x-' if it only annotates)")
        for key in ("anyOf", "oneOf", "allOf"):
            if key in schema and (not isinstance(schema[key], list) or not schema[key]):
                raise _err(path, f"'{key}' must be a non-empty list of schemas")
        if "enum" in schema and not isinstance(schema["enum"], list):
            raise _err(path, "'enum' must be a list of values")
        if "required" in schema:
            req = schema["required"]
            if not isinstance(req, list) or any(not isinstance(x, str) for x in req) or len(set(req)) != len(req):
                raise _err(path, "'required' must be a list of distinct property names")
        if "properties" in schema and (not isinstance(schema["properties"], dict)
                                       or any(not isinstance(k, str) for k in schema["properties"])):
            raise _err(path, "'properties' must be an object mapping names to schemas")
        for key in ("additionalProperties", "unevaluatedProperties", "additionalItems", "unevaluatedItems"):
            if key in schema and not isinstance(schema[key], (bool, dict)):
                raise _err(path, f"'{key}' must be a schema (an object or a boolean)")
        if "uniqueItems" in schema and not isinstance(schema["uniqueItems"], bool):
            raise _err(path, "'uniqueItems' must be a boolean")
        for key in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
            if key in schema:
                _as_count(schema[key], path, key)
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            if key in schema and not (key.startswith("exclusive") and isinstance(schema[key], bool)):
                _as_number(schema[key], path, key)
        for key in ("$defs", "definitions"):
            if key in schema and not isinstance(schema[key], dict):
                raise _err(path, f"'{key}' must be an object mapping names to schemas")

    def types(self, schema: dict, path: str) -> list[str] | None:
        types = _schema_types(schema, path)
        if types is None:
            # no 'type': the keywords tell which types are meant (a narrowing: others are not produced)
            types = [t for t, keys in (("object", _OBJECT_KEYWORDS), ("array", _ARRAY_KEYWORDS),
                                       ("string", _STRING_KEYWORDS), ("number", _NUMBER_KEYWORDS))
                     if any(k in schema for k in keys)]
            if not types:
                return None
        if "number" in types and "integer" in types:
            types.remove("integer")  # number includes the integers
        return types

    # ---- $ref

    def resolve(self, ref: Any, path: str) -> Any:
        if not isinstance(ref, str):
            raise _err(path, f"'$ref' must be a string, got {ref!r}")
        if not ref.startswith("#"):
            raise _err(path, f"'$ref': {ref!r} is not a local reference; only references into the same "
                             "schema ('#/$defs/Name', '#/definitions/Name', '#') are supported: inline the "
                             "referenced schema under '$defs'")
        fragment = unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            raise _err(path, f"'$ref': {ref!r} names an anchor; anchors are not supported, use a JSON "
                             "pointer such as '#/$defs/Name'")
        node: Any = self.root
        for part in fragment.split("/")[1:] if fragment else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise _err(path, f"'$ref': {ref!r} does not resolve: no {part!r} in the schema")
        return node

    def ref(self, ref: str, path: str) -> Node:
        target = self.resolve(ref, path)
        if ref in self.unsat_refs:
            raise _Unsat(path, self.unsat_refs[ref])
        if ref in self.ref_rules:
            return ("ref", self.ref_rules[ref])
        last = unquote(ref[1:]).rsplit("/", 1)[-1]
        name = self.alloc("root" if ref == "#" else last or "ref")
        self.ref_rules[ref] = name
        try:
            body = self.gen(target, name, ref)
        except _Unsat as e:
            self.unsat_refs[ref] = str(e)
            del self.ref_rules[ref]
            raise
        self.define(name, body, name)
        return ("ref", name)

    # ---- allOf

    def flatten_all_of(self, schema: Any, path: str, out: list, refs: tuple, top: bool) -> None:
        if schema is True:
            return
        if schema is False:
            raise _Unsat(path, "an 'allOf' member is 'false'")
        if not isinstance(schema, dict):
            raise _err(path, f"a schema must be an object or a boolean, got {type(schema).__name__}")
        self.check_keywords(schema, path)
        if not top:
            for key in ("unevaluatedProperties", "unevaluatedItems"):
                if key in schema and schema[key] is not True:
                    raise _err(path, f"'{key}' inside 'allOf' (or beside '$ref') is not supported: it "
                                     "would forbid what the other members allow; move it to the "
                                     "schema that holds the 'allOf'")
        rest = {k: v for k, v in schema.items() if k not in ("allOf", "$ref") and k not in _ANNOTATIONS}
        if "$ref" in schema:
            ref = schema["$ref"]
            if ref in refs:
                raise _err(path, f"'$ref' {ref!r} includes itself through 'allOf'/'$ref' without "
                                 "an enclosing object or array: the schema has no finite instance")
            self.flatten_all_of(self.resolve(ref, path), ref, out, refs + (ref,), False)
        for i, sub in enumerate(schema.get("allOf", ())):
            self.flatten_all_of(sub, f"{path}/allOf/{i}", out, refs, False)
        if rest:
            out.append(rest)

    def merge_all_of(self, schema: dict, path: str) -> dict:
        parts: list[dict] = []
        self.flatten_all_of(schema, path, parts, (), True)
        merged: dict[str, Any] = {}
        deferred: list[dict] = []
        obj_parts = []  # (properties, additionalProperties or True) of each member
        arr_parts = []  # (prefixItems, items or True, whether items is given) of each member
        for part in parts:
            if any(k in part for k in ("properties", "additionalProperties")):
                obj_parts.append((part.get("properties", {}), part.get("additionalProperties", True)))
            if any(k in part for k in ("prefixItems", "items", "additionalItems")):
                items = part.get("items")
                if isinstance(items, list):
                    arr_parts.append((items, part.get("additionalItems", True), "additionalItems" in part))
                else:
                    prefix = part.get("prefixItems", [])
                    if not isinstance(prefix, list):
                        raise _err(path, "'prefixItems' must be a list of schemas")
                    arr_parts.append((prefix, True if items is None else items, items is not None))
            for key, value in part.items():
                if key in ("properties", "additionalProperties", "prefixItems", "items", "additionalItems"):
                    continue
                if key not in merged:
                    merged[key] = value
                    continue
                old = merged[key]
                if key in ("anyOf", "oneOf"):
                    deferred.append({key: value})
                elif key == "type":
                    a = _schema_types({"type": old}, path) or []
                    b = _schema_types({"type": value}, path) or []
                    both = []
                    for t in a:
                        if t in b:
                            u: str | None = t
                        elif (t == "integer" and "number" in b) or (t == "number" and "integer" in b):
                            u = "integer"  # the integers are numbers
                        else:
                            u = None
                        if u is not None and u not in both:
                            both.append(u)
                    if not both:
                        raise _Unsat(path, f"'allOf' members require types {a} and {b}")
                    merged[key] = both
                elif key == "enum":
                    keys = {_json_key(v) for v in value}
                    merged[key] = [v for v in old if _json_key(v) in keys]
                elif key == "const":
                    if _json_key(old) != _json_key(value):
                        raise _Unsat(path, f"'allOf' members require const {old!r} and {value!r}")
                elif key == "required":
                    merged[key] = old + [x for x in value if x not in old]
                elif key in ("minLength", "minItems", "minProperties", "minimum"):
                    merged[key] = max(old, value)
                elif key in ("maxLength", "maxItems", "maxProperties", "maximum"):
                    merged[key] = min(old, value)
                elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(old, bool) \
                        and not isinstance(value, bool):
                    merged[key] = max(old, value) if key == "exclusiveMinimum" else min(old, value)
                elif key in ("unevaluatedProperties", "unevaluatedItems"):
                    merged[key] = {"allOf": [old, value]}
                elif key == "uniqueItems":
                    merged[key] = old or value
                elif _json_key(old) != _json_key(value):
                    raise _err(path, f"'allOf' members give '{key}' different values ({old!r} and {value!r}); "
                                     "they cannot be merged: write one schema with the combined constraint")
        if obj_parts:
            # a key of one member is checked by the other members' properties, or else by
            # their additionalProperties (absent: anything)
            names: list[str] = []
            for props, _ in obj_parts:
                if not isinstance(props, dict):
                    raise _err(path, "'properties' must be an object mapping names to schemas")
                names += [n for n in props if n not in names]
            merged["properties"] = {n: _all_of([props[n] if n in props else addl for props, addl in obj_parts])
                                    for n in names}
            if any("additionalProperties" in p for p in parts):
                merged["additionalProperties"] = _all_of([addl for _, addl in obj_parts])
        if arr_parts:
            # the same for arrays: item i is checked by each member's prefixItems[i], or else its items
            n = max(len(prefix) for prefix, _, _ in arr_parts)
            if n:
                merged["prefixItems"] = [_all_of([prefix[i] if i < len(prefix) else rest
                                                  for prefix, rest, _ in arr_parts]) for i in range(n)]
            if any(given for _, _, given in arr_parts):
                merged["items"] = _all_of([rest for _, rest, _ in arr_parts])
        if deferred:
            merged["allOf"] = deferred
        return merged

    # ---- anyOf / oneOf

    def gen_alternatives(self, schema: dict, key: str, hint: str, path: str) -> Node:
        alts = schema[key]
        rest = {k: v for k, v in schema.items() if k != key}
        constrained = any(k not in _ANNOTATIONS for k in rest)
        if constrained:  # S and (A or B) = (S and A) or (S and B)
            alts = [{**rest, "allOf": [a, *rest.get("allOf", ())]} for a in alts]
        if key == "oneOf":
            self.check_exclusive(alts, path)
        branches = []
        last: _Unsat | None = None
        for i, alt in enumerate(alts):
            try:
                branches.append(self.gen(alt, f"{hint}-{i}", f"{path}/{key}/{i}"))
            except _Unsat as e:
                last = e
        if not branches:
            raise last or _Unsat(path, f"no '{key}' alternative admits a value")
        node = _alt(*branches)
        return node if _is_atom(node) else self.define(hint, node)

    def check_exclusive(self, alts: list, path: str) -> None:
        views = []
        for alt in alts:
            try:
                if isinstance(alt, dict) and ("allOf" in alt or "$ref" in alt):
                    alt = self.merge_all_of(alt, path)
            except _Unsat:
                alt = False
            views.append(alt)
        for i in range(len(views)):
            for j in range(i + 1, len(views)):
                if not self.disjoint(views[i], views[j], 0):
                    raise _err(path, f"'oneOf' alternatives {i} and {j} may both match the same value, and a "
                                     "grammar cannot enforce 'exactly one'. Use 'anyOf' if that is acceptable, "
                                     "or make them exclusive: different types, or a required property "
                                     "with a different 'const'/'enum' in each")

    def view(self, schema: Any, depth: int) -> Any:
        """A schema with its top-level $ref / allOf resolved, for the disjointness test."""
        if isinstance(schema, dict) and ("$ref" in schema or "allOf" in schema) and depth < 16:
            try:
                return self.merge_all_of(schema, "#")
            except (_Unsat, GrammarError):
                return schema if not isinstance(schema, dict) else {}
        return schema

    def kinds(self, schema: Any) -> set[str]:
        """JSON kinds a schema admits (a superset: exact semantics, not our narrowing)."""
        if schema is False:
            return set()
        if not isinstance(schema, dict):
            return set(_ALL_KINDS)
        kinds = set(_ALL_KINDS)
        t = schema.get("type")
        if isinstance(t, str):
            t = [t]
        if isinstance(t, list) and all(x in _TYPES for x in t):
            kinds = set().union(*(_kinds_of_type(x) for x in t))
        values = self.values(schema)
        if values is not None:
            kinds &= {_json_kind(v) for v in values}
        return kinds

    @staticmethod
    def values(schema: dict) -> list | None:
        if "const" in schema:
            return [schema["const"]]
        if isinstance(schema.get("enum"), list):
            return schema["enum"]
        return None

    def disjoint(self, a: Any, b: Any, depth: int) -> bool:
        """True only if no value matches both schemas (exact JSON Schema semantics)."""
        a, b = self.view(a, depth), self.view(b, depth)
        if a is False or b is False:
            return True
        if not isinstance(a, dict) or not isinstance(b, dict):
            return False
        va, vb = self.values(a), self.values(b)
        if va is not None and vb is not None and not ({_json_key(v) for v in va} & {_json_key(v) for v in vb}):
            return True
        common = self.kinds(a) & self.kinds(b)
        if not common:
            return True
        if common != {"object"} or depth > 8:
            return False
        pa, pb = a.get("properties"), b.get("properties")
        ra, rb = a.get("required"), b.get("required")
        if not all(isinstance(x, (dict, list)) for x in (pa, pb, ra, rb)):
            return False
        return any(name in pb and name in ra and name in rb and self.disjoint(pa[name], pb[name], depth + 1)
                   for name in pa)

    # ---- enum / const

    def gen_enum(self, schema: dict, hint: str, path: str) -> Node:
        others = [k for k in schema if k not in ("enum", "const", "type") and k not in _ANNOTATIONS
                  and k not in _VALUE_CHECKS]
        if others:
            raise _err(path, f"'enum'/'const' cannot be combined with {others}: list only the values that "
                             "satisfy the other keywords")
        if "const" in schema:
            values = [schema["const"]]
            if "enum" in schema:
                keys = {_json_key(v) for v in schema["enum"]}
                values = [v for v in values if _json_key(v) in keys]
        else:
            values = list(schema["enum"])
        values = [v for v in values if _value_ok(v, schema, path)]
        types = _schema_types(schema, path)
        if types is not None:
            kinds = set().union(*(_kinds_of_type(t) for t in types))
            values = [v for v in values if _json_kind(v) in kinds]
            if "integer" in types and "number" not in types:
                values = [int(v) if isinstance(v, float) else v for v in values]
        seen, texts = set(), []
        for v in values:
            if _json_kind(v) is None:
                raise _err(path, f"enum/const value {v!r} is not a JSON value")
            if _json_key(v) not in seen:
                seen.add(_json_key(v))
                texts.append(_json_text(v))
        if not texts:
            raise _Unsat(path, "no 'enum'/'const' value is allowed (by 'type')")
        node = _alt(*(_lit(t) for t in texts))
        return node if _is_atom(node) else self.define(hint, node)

    # ---- per type

    def gen_type(self, t: str, schema: dict, hint: str, path: str) -> Node:
        if t == "null":
            return _lit("null")
        if t == "boolean":
            return self.boolean()
        if t == "string":
            return self.gen_string(schema, hint, path)
        if t in ("integer", "number"):
            return self.gen_number(t, schema, hint, path)
        if t == "object":
            return self.gen_object(schema, hint, path)
        return self.gen_array(schema, hint, path)

    def gen_string(self, schema: dict, hint: str, path: str) -> Node:
        lo = _as_count(schema.get("minLength", 0), path, "minLength")
        hi = schema.get("maxLength")
        hi = None if hi is None else _as_count(hi, path, "maxLength")
        if hi is not None and hi < lo:
            raise _Unsat(path, f"maxLength {hi} < minLength {lo}")
        fmt = schema.get("format")
        if fmt is not None:
            if fmt not in SUPPORTED_FORMATS:
                raise _err(path, f"format {fmt!r} is not supported (supported: {', '.join(SUPPORTED_FORMATS)}); "
                                 "drop 'format' and check the value after generation")
            fmin, fmax = {"date": (10, 10), "uuid": (36, 36), "time": (9, 24), "date-time": (20, 35)}[fmt]
            if lo > fmin or (hi is not None and hi < fmax):
                raise _err(path, f"minLength/maxLength cannot be combined with format {fmt!r} (its values have "
                                 f"{fmin} to {fmax} characters); drop minLength/maxLength")
            return self.format_rule(fmt)
        if lo == 0 and hi is None:
            return self.string()
        return self.define(hint, _seq(_lit('"'), self.rep(self.char(), lo, hi, "char"), _lit('"')))

    def format_rule(self, fmt: str) -> Node:
        d, d9 = ("cls", "[0-9]"), ("cls", "[1-9]")

        def date() -> Node:
            year = _alt(_seq(d9, _r(d, 3, 3)),
                        _seq(_lit("0"), _alt(_seq(d9, _r(d, 2, 2)),
                                             _seq(_lit("0"), _alt(_seq(d9, d), _seq(_lit("0"), d9))))))
            leap_yy = _alt(_seq(_lit("0"), ("cls", "[48]")), _seq(("cls", "[2468]"), ("cls", "[048]")),
                           _seq(("cls", "[13579]"), ("cls", "[26]")))
            leap = _alt(_seq(_r(d, 2, 2), leap_yy), _seq(leap_yy, _lit("00")))
            d28 = _alt(_seq(_lit("0"), d9), _seq(_lit("1"), d), _seq(_lit("2"), ("cls", "[0-8]")))
            d30 = _alt(_seq(_lit("0"), d9), _seq(("cls", "[12]"), d), _lit("30"))
            d31 = _alt(_seq(_lit("0"), d9), _seq(("cls", "[12]"), d), _seq(_lit("3"), ("cls", "[01]")))
            m31 = _alt(_seq(_lit("0"), ("cls", "[13578]")), _seq(_lit("1"), ("cls", "[02]")))
            m30 = _alt(_seq(_lit("0"), ("cls", "[469]")), _lit("11"))
            y = self.define("year", year)
            ly = self.define("leap-year", leap)
            return _alt(_seq(y, _lit("-"), _alt(_seq(m31, _lit("-"), d31), _seq(m30, _lit("-"), d30),
                                                 _seq(_lit("02-"), d28))),
                        _seq(ly, _lit("-02-29")))

        def time() -> Node:
            hour = _alt(_seq(("cls", "[01]"), d), _seq(_lit("2"), ("cls", "[0-3]")))
            minute = _seq(("cls", "[0-5]"), d)
            offset = _alt(_lit("Z"), _seq(("cls", "[-+]"), hour, _lit(":"), minute))
            return _seq(hour, _lit(":"), minute, _lit(":"), minute, _opt(_seq(_lit("."), _r(d, 1, 9))), offset)

        if fmt == "date":
            return self.shared_rule("date", lambda: _seq(_lit('"'), self.shared_rule("date-value", date), _lit('"')))
        if fmt == "time":
            return self.shared_rule("time", lambda: _seq(_lit('"'), self.shared_rule("time-value", time), _lit('"')))
        if fmt == "date-time":
            return self.shared_rule("date-time", lambda: _seq(
                _lit('"'), self.shared_rule("date-value", date), _lit("T"), self.shared_rule("time-value", time),
                _lit('"')))
        h = ("cls", "[0-9a-f]")
        return self.shared_rule("uuid", lambda: _seq(
            _lit('"'), _r(h, 8, 8), _lit("-"), _r(h, 4, 4), _lit("-"), _r(h, 4, 4), _lit("-"), _r(h, 4, 4),
            _lit("-"), _r(h, 12, 12), _lit('"')))

    def bounds(self, schema: dict, path: str) -> tuple:
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
            lo = (_as_number(schema["minimum"], path, "minimum"), emin is True)
        if "maximum" in schema:
            hi = (_as_number(schema["maximum"], path, "maximum"), emax is True)
        for key, val, lower in (("exclusiveMinimum", emin, True), ("exclusiveMaximum", emax, False)):
            if isinstance(val, bool):
                if val and ("minimum" if lower else "maximum") not in schema:
                    raise _err(path, f"'{key}': true needs '{'minimum' if lower else 'maximum'}'")
            elif val is not None:
                b = (_as_number(val, path, key), True)
                if lower:
                    lo = tighter(lo, b, True)
                else:
                    hi = tighter(hi, b, False)
        return lo, hi

    def gen_number(self, t: str, schema: dict, hint: str, path: str) -> Node:
        lo, hi = self.bounds(schema, path)
        if "multipleOf" in schema:
            m = _as_number(schema["multipleOf"], path, "multipleOf")
            if m <= 0:
                raise _err(path, "'multipleOf' must be > 0")
            if not (t == "integer" and (1 / m).denominator == 1):
                raise _err(path, f"'multipleOf' {schema['multipleOf']!r} is not supported (only when every "
                                 "integer is a multiple, e.g. 1 with type integer); drop it and check the "
                                 "value after generation")
        if t == "integer":
            if lo is None and hi is None:
                return self.integer()
            a = -math.inf if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
            b = math.inf if hi is None else (math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0]))
            if a > b:
                raise _Unsat(path, "no integer lies between minimum and maximum")
            a, b = max(a, -_INT_MAX), min(b, _INT_MAX)
            if a > b:
                raise _err(path, f"the bounds leave no integer of at most {MAX_INT_DIGITS} digits (the limit "
                                 "of the canonical form)")
            return self.define(hint, _alt(*_int_range(a, b)))
        if lo is None and hi is None:
            return self.number()
        for b in (lo, hi):
            if b is not None and b[0].denominator != 1:
                raise _err(path, f"a non-integer bound ({float(b[0])!r}) on a number is not supported; use "
                                 "integer bounds (such as 0 and 1) or scale the quantity")
        limit = Fraction(_INT_MAX + 1)
        if lo is None or lo[0] < -limit:
            lo = (-limit, True)
        if hi is None or hi[0] > limit:
            hi = (limit, True)
        a, ea, b, eb = int(lo[0]), lo[1], int(hi[0]), hi[1]
        alts = []
        if b > 0 or (b == 0 and not eb):  # values written without '-'
            alts += self.magnitudes(max(a, 0), ea if a >= 0 else False, b, eb)
        if a < 0:  # values written with '-': magnitudes w with -w in range ('-0.0' if 0 is)
            wl, wl_excl = (-b, eb) if b < 0 else (0, b == 0 and eb)
            for x in self.magnitudes(wl, wl_excl, -a, ea):
                alts.append(_seq(_lit("-"), x))
        if not alts:
            raise _Unsat(path, "no number lies between minimum and maximum")
        return self.define(hint, _alt(*alts))

    def magnitudes(self, lo: int, lo_excl: bool, hi: int, hi_excl: bool) -> list[Node]:
        """Decimal texts 'I' / 'I.F' (no exponent) of the values in the interval, 0 <= lo <= hi.

        Next to an exclusive bound, at most 15 significant digits: a longer text such as
        1.00000000000000000001 would be read as the double 1.0, on the bound."""
        d = ("cls", "[0-9]")
        zeros = _opt(_seq(_lit("."), _r(_lit("0"), 1, MAX_FRAC_DIGITS)))

        def safe(i: int, above_zero: bool) -> int:  # fraction digits that keep I.F off a bound
            return MAX_FRAC_DIGITS if (i == 0 and above_zero) else _SAFE_DIGITS - (len(str(i)) if i else 0)

        def nonzero(n: int) -> Node:  # '.' and 1..n digits, not all zero
            return _seq(_lit("."), _alt(*(_seq(_r(_lit("0"), k, k), ("cls", "[1-9]"), _r(d, 0, n - 1 - k))
                                          for k in range(n))))

        if lo > hi:
            return []
        if lo == hi:
            return [] if lo_excl or hi_excl else [_seq(_lit(str(lo)), zeros)]
        out = []
        first = lo
        if lo_excl:  # I = lo: the fraction must not be zero
            n = safe(lo, True)
            if hi_excl and hi == lo + 1:
                n = min(n, safe(lo, False))
            if n >= 1:
                out.append(_seq(_lit(str(lo)), nonzero(n)))
            first = lo + 1
        last, top = hi - 1, None
        if hi_excl and hi - 1 >= first:  # I = hi - 1: the fraction must not round up to hi
            n = safe(hi - 1, False)
            top = _seq(_lit(str(hi - 1)), _opt(_seq(_lit("."), _r(d, 1, n))) if n >= 1 else EMPTY)
            last = hi - 2
        if first <= last:
            out.append(_seq(_alt(*_int_range(first, last)), self.frac_opt()))
        if top is not None:
            out.append(top)
        if not hi_excl:
            out.append(_seq(_lit(str(hi)), zeros))
        return out

    # ---- objects

    def gen_object(self, schema: dict, hint: str, path: str) -> Node:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        addl = schema.get("additionalProperties")
        if addl is None:
            addl = schema.get("unevaluatedProperties")
        if addl is None:  # absent: none when properties are listed (canonical form), else anything
            addl = False if "properties" in schema else True
        names = list(props) + [r for r in required if r not in props]
        fields: list[tuple[Node, bool]] = []
        for name in names:
            sub = props[name] if name in props else addl
            is_req = name in required
            sub_path = f"{path}/properties/{_pointer_escape(name)}"
            try:
                value = self.gen(sub, f"{hint}-{name}", sub_path)
            except _Unsat as e:
                if is_req:
                    raise _Unsat(sub_path, f"required property {name!r} admits no value ({e})") from None
                continue
            fields.append((_seq(_lit(_json_text(name)), self.colon(), value), is_req))
        extra: Node | None = None
        if addl is not False:
            try:
                value = self.gen(addl, f"{hint}-value", f"{path}/additionalProperties")
            except _Unsat:
                value = None
            if value is not None:
                key = self.key_excluding(names, f"{hint}-key") if names else self.string()
                extra = self.simple(_seq(key, self.colon(), value), f"{hint}-extra")
        n_req = sum(1 for _, r in fields if r)
        if "minProperties" in schema:
            m = _as_count(schema["minProperties"], path, "minProperties")
            if m > n_req:
                raise _err(path, f"'minProperties' {m} is more than the {n_req} required properties; the "
                                 "grammar cannot count optional ones: list enough properties in 'required'")
        if "maxProperties" in schema:
            m = _as_count(schema["maxProperties"], path, "maxProperties")
            if extra is not None or m < len(fields):
                if m < n_req:
                    raise _Unsat(path, f"'maxProperties' {m} is less than the required properties")
                raise _err(path, f"'maxProperties' {m} cannot be expressed (the object may have more "
                                 "properties); drop it, or set 'additionalProperties': false and list at "
                                 f"most {m} properties")
        return self.define(hint, self.object_body(fields, extra, hint))

    def object_body(self, fields: list[tuple[Node, bool]], extra: Node | None, hint: str) -> Node:
        comma = self.comma()
        more = self.rep(_seq(comma, extra), 0, None, f"{hint}-more") if extra is not None else EMPTY
        if any(r for _, r in fields):
            first = next(i for i, (_, r) in enumerate(fields) if r)
            parts = [_opt(_seq(kv, comma)) for kv, _ in fields[:first]] + [fields[first][0]]
            parts += [_seq(comma, kv) if r else _opt(_seq(comma, kv)) for kv, r in fields[first + 1:]]
            return self.bracket("{", _seq(*parts, more), False, "}")
        kvs = [kv for kv, _ in fields]
        alts = [_seq(kv, *(_opt(_seq(comma, k)) for k in kvs[i + 1:]), more) for i, kv in enumerate(kvs)]
        if extra is not None:
            alts.append(_seq(extra, more))
        return self.bracket("{", _alt(*alts) if alts else EMPTY, True, "}")

    def key_excluding(self, names: list[str], hint: str) -> Node:
        """A JSON string key (without escapes) that is none of ``names``."""
        kc = '"\\\\\\x00-\\x1F'
        kchar = self.shared_rule("key-char", lambda: ("cls", f"[^{kc}]"))
        trie: dict = {}
        for name in names:
            if any(c in '"\\' or ord(c) < 0x20 or 0xD800 <= ord(c) <= 0xDFFF for c in name):
                continue  # cannot be written without escapes: never produced anyway
            node = trie
            for c in name:
                node = node.setdefault(c, {})
            node[""] = {}

        def build(node: dict, label: str) -> Node:
            children = sorted(c for c in node if c)
            if not children:  # a listed name: any continuation makes it another key
                return _r(kchar, 1, None)
            excluded = "".join(_gbnf_char(c, True) for c in children)
            alts = [EMPTY] if "" not in node else []
            alts.append(_seq(("cls", f"[^{kc}{excluded}]"), _r(kchar, 0, None)))
            for i, c in enumerate(children):
                alts.append(_seq(_lit(c), build(node[c], f"{label}-{i}")))
            return self.define(label, _alt(*alts))

        return _seq(_lit('"'), build(trie, hint), _lit('"'))

    # ---- arrays

    def gen_array(self, schema: dict, hint: str, path: str) -> Node:
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        if isinstance(items, list):  # draft 4-2019: items as a list, additionalItems for the rest
            if prefix is not None:
                raise _err(path, "'items' is a list and 'prefixItems' is given; use 'prefixItems' only")
            prefix, items = items, schema.get("additionalItems")
        if prefix is not None and not isinstance(prefix, list):
            raise _err(path, "'prefixItems' must be a list of schemas")
        prefix = prefix or []
        if items is None:
            items = schema.get("unevaluatedItems")
        if items is None:  # absent: none after prefixItems (canonical form), else anything
            items = False if prefix else True
        lo = _as_count(schema.get("minItems", 0), path, "minItems")
        hi = schema.get("maxItems")
        hi = None if hi is None else _as_count(hi, path, "maxItems")
        if hi is not None and hi < lo:
            raise _Unsat(path, f"maxItems {hi} < minItems {lo}")
        if schema.get("uniqueItems") is True and (hi is None or hi > 1):
            raise _err(path, "'uniqueItems': true is not supported (a grammar cannot compare items); drop it "
                             "and check after generation, or use 'prefixItems' with distinct 'const's")
        heads: list[Node] = []
        for i, sub in enumerate(prefix):
            if hi is not None and i >= hi:
                break
            try:
                heads.append(self.gen(sub, f"{hint}-{i}", f"{path}/prefixItems/{i}"))
            except _Unsat:
                hi = i if hi is None else min(hi, i)  # the array must end before this item
                break
        rest = None
        if len(heads) == len(prefix):
            try:
                rest = self.gen(items, f"{hint}-item", f"{path}/items")
            except _Unsat:
                pass
        n = len(heads)
        if rest is None:
            hi = n if hi is None else min(hi, n)
        if hi is not None and lo > hi:
            raise _Unsat(path, f"minItems {lo} but at most {hi} items can be valid (set 'items' for the items "
                               "after 'prefixItems')")
        return self.define(hint, self.array_body(heads, rest, lo, hi, hint))

    def array_body(self, heads: list[Node], rest: Node | None, lo: int, hi: int | None, hint: str) -> Node:
        comma = self.comma()
        # canonical form: all prefix items are present (callers cut them at maxItems), then the others
        n = len(heads)
        if n == 0:
            if rest is None or hi == 0:
                return self.bracket("[", EMPTY, True, "]")
            tail = self.rep(_seq(comma, rest), max(lo - 1, 0), None if hi is None else hi - 1, f"{hint}-more")
            return self.bracket("[", _seq(rest, tail), lo == 0, "]")
        parts = [heads[0]] + [_seq(comma, h) for h in heads[1:n]]
        if rest is not None and (hi is None or hi > n):
            parts.append(self.rep(_seq(comma, rest), max(lo - n, 0), None if hi is None else hi - n, f"{hint}-more"))
        return self.bracket("[", _seq(*parts), False, "]")

    # ---- output

    def reachable(self) -> dict[str, Node]:
        """The rules root reaches, breadth first from root."""
        order, todo = ["root"], 0
        while todo < len(order):
            body = self.rules[order[todo]]
            todo += 1
            if body is None:
                raise AssertionError(f"rule {order[todo - 1]} has no body")
            refs: list[str] = []
            _walk_refs(body, refs)
            order += [r for r in dict.fromkeys(refs) if r not in order]
        return {n: self.rules[n] for n in order}

    def finish(self) -> str:
        rules = self.reachable()
        # a rule that is only another rule's name takes that rule's body, if nothing else uses it
        counts: dict[str, int] = {}
        for b in rules.values():
            refs: list[str] = []
            _walk_refs(b, refs)
            for r in refs:
                counts[r] = counts.get(r, 0) + 1
        for n in list(rules):
            b = self.rules[n]
            if b[0] == "ref" and b[1] != n and counts.get(b[1]) == 1:
                self.rules[n] = self.rules[b[1]]
        rules = self.reachable()
        # nullable rules, then left recursion (llama.cpp rejects it) and rules with no finite string
        nullable: set[str] = set()
        prod: set[str] = set()
        changed = True
        while changed:
            changed = False
            for n, b in rules.items():
                if n not in nullable and _nullable(b, nullable):
                    nullable.add(n)
                    changed = True
                if n not in prod and _productive(b, prod):
                    prod.add(n)
                    changed = True
        bad = [n for n in rules if n not in prod]
        if bad:
            raise GrammarError(f"the JSON Schema only admits infinitely nested values (through {bad[0]!r}): a "
                               "recursive $ref must be optional somewhere (not required, or in an array "
                               "that may be empty, or one alternative of an anyOf)")
        starts = {}
        for n, b in rules.items():
            s: set[str] = set()
            _left_refs(b, nullable, s)
            starts[n] = s
        for n in rules:
            seen, todo = set(), list(starts[n])
            while todo:
                m = todo.pop()
                if m == n:
                    raise GrammarError(f"the JSON Schema refers to itself (through {n!r}) without an enclosing "
                                       "object or array (e.g. anyOf/allOf of its own $ref): such a schema "
                                       "adds nothing; remove the self-reference")
                if m not in seen:
                    seen.add(m)
                    todo += starts[m]
        return "".join(f"{n} ::= {_render(b)}\n" for n, b in rules.items())


# keywords beside enum/const that filter the values
_VALUE_CHECKS = frozenset({"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                           "required", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


def _value_ok(v: Any, schema: dict, path: str) -> bool:
    """Whether an enum/const value satisfies the _VALUE_CHECKS keywords of the schema."""
    kind = _json_kind(v)
    if kind == "string":
        n = len(v)
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
                    if not x > _as_number(schema["minimum"], path, "minimum"):
                        return False
                if bound and key == "exclusiveMaximum" and "maximum" in schema:
                    if not x < _as_number(schema["maximum"], path, "maximum"):
                        return False
            elif bound is not None and not ok(_as_number(bound, path, key)):
                return False
    return True


def _all_of(schemas: list) -> Any:
    """The conjunction of schemas, as a schema."""
    if any(s is False for s in schemas):
        return False
    schemas = [s for s in schemas if s is not True]
    return True if not schemas else schemas[0] if len(schemas) == 1 else {"allOf": schemas}


def _pointer_escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _uint_range(a: int, b: int) -> list[Node]:
    """Canonical decimal texts (no leading zero) of the integers in [a, b], 0 <= a <= b."""
    alts: list[Node] = []
    full_from = None  # first length of a run of lengths covered entirely
    if a == 0:
        alts.append(_lit("0"))
        if b == 0:
            return alts
        a = 1

    def flush(upto: int) -> None:
        nonlocal full_from
        if full_from is not None:
            alts.append(_seq(("cls", "[1-9]"), _r(("cls", "[0-9]"), full_from - 1, upto - 1)))
            full_from = None

    for n in range(len(str(a)), len(str(b)) + 1):
        lo = max(a, 10 ** (n - 1))
        hi = min(b, 10 ** n - 1)
        if lo > hi:
            continue
        if lo == 10 ** (n - 1) and hi == 10 ** n - 1:
            if full_from is None:
                full_from = n
            continue
        flush(n - 1)
        alts += _same_length(str(lo), str(hi))
    flush(len(str(b)))
    return alts


def _digits(a: str, b: str) -> Node:
    return _lit(a) if a == b else ("cls", f"[{a}-{b}]")


def _same_length(x: str, y: str) -> list[Node]:
    """Digit strings of the same length between x and y (inclusive)."""
    n = len(x)
    if x == y:
        return [_lit(x)]
    if n == 1:
        return [_digits(x, y)]
    if x[0] == y[0]:
        return [_seq(_lit(x[0]), _alt(*_same_length(x[1:], y[1:])))]
    tail_lo, tail_hi = "0" * (n - 1), "9" * (n - 1)
    if x[1:] == tail_lo and y[1:] == tail_hi:
        return [_seq(_digits(x[0], y[0]), _r(("cls", "[0-9]"), n - 1, n - 1))]
    out = []
    first, last = int(x[0]), int(y[0])
    if x[1:] != tail_lo:
        out.append(_seq(_lit(x[0]), _alt(*_same_length(x[1:], tail_hi))))
        first += 1
    if y[1:] != tail_hi:
        last -= 1
    if first <= last:
        out.append(_seq(_digits(str(first), str(last)), _r(("cls", "[0-9]"), n - 1, n - 1)))
    if y[1:] != tail_hi:
        out.append(_seq(_lit(y[0]), _alt(*_same_length(tail_lo, y[1:]))))
    return out


def _int_range(a: int, b: int) -> list[Node]:
    """Canonical decimal texts of the integers in [a, b] ('-0' excluded)."""
    alts: list[Node] = []
    if b >= 0:
        alts += _uint_range(max(a, 0), b)
    if a < 0:
        alts.append(_seq(_lit("-"), _alt(*_uint_range(max(-b, 1), -a))))
    return alts


def json_schema_to_gbnf(schema: Union[dict, bool], *, compact: bool = True) -> str:
    """The GBNF grammar (llama.cpp's format, rule ``root``) of the canonical JSON texts of the
    instances of ``schema``.

    compact  True: no whitespace at all (``{"a":1,"b":[1,2]}``), which forces the most tokens;
             False: up to 24 whitespace characters (space, tab, newline, CR) around each
             ``{ } [ ] : ,`` (never before or after the whole value), so pretty-printed output
             (``json.dumps(x, indent=2)``) is accepted too.

    Raises GrammarError for an invalid schema, an unsatisfiable one, or one that uses a keyword
    the converter cannot express exactly (docs/structured-output.md lists them).
    """
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"a JSON Schema must be a dict or a bool, got {type(schema).__name__}")
    conv = _Converter(schema, bool(compact))
    try:
        name = conv.alloc("root")
        conv.ref_rules["#"] = name
        conv.define("root", conv.gen(schema, "root", "#"), "root")
        return conv.finish()
    except _Unsat as e:
        raise GrammarError(f"the JSON Schema admits no value: {e}. Fix the schema (a required property "
                           "or type that cannot be satisfied)") from None
    except RecursionError:
        raise GrammarError("the JSON Schema is nested too deeply to convert") from None


#: any JSON value, compact canonical form (what ``json_schema=True`` uses)
JSON_GBNF: str = json_schema_to_gbnf(True)
