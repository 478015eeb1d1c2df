"""The converter: a JSON Schema, keyword by keyword and type by type, to the rules of its
grammar; and json_schema_to_gbnf, the entry point."""
from __future__ import annotations

import json
import math
from fractions import Fraction
from dataclasses import dataclass
from typing import Any, Union
from urllib.parse import unquote

from ..errors import GrammarError, UnenforceableSchemaError, UnsupportedRegexError
from .composition import (_all_of, _exclusive, _exclusive_required, _merge_all_of, _negate,
                          _split_conditional, _split_dependencies)
from .formats import ALIASES, FORMATS, format_pattern
from .formats import UNENFORCEABLE as UNENFORCEABLE_FORMATS
from .gbnf import EMPTY, Node, _alt, _gbnf_char, _is_atom, _lit, _opt, _r, _seq
from .json_values import _json_key, _json_kind, _json_text
from .numbers import (MAX_EXP_DIGITS, MAX_FRAC_DIGITS, MAX_INT_DIGITS, MAX_SAFE_DIGITS, _INT_MAX, _frac_opt,
                      _int_range, _tenths, _uint, decimal_range, lower_threshold, upper_threshold)
from .refs import local_refs
from .regex import Regex, may_overlap, parse_regex, regex_node
from .rules import _Rules
from .schema import (_ARRAY_KEYWORDS, _NUMBER_KEYWORDS, _OBJECT_KEYWORDS, _STRING_KEYWORDS, _SUPPORTED, _UNSUPPORTED,
                     _VALUE_CHECKS, _Unsat, _as_count, _as_number, _bounds, _check_keywords, _constrains, _err,
                     _kinds_of_type, _pointer_escape, _resolve, _schema_types, _unenforceable, _value_ok, check_json)
from .validation import SchemaCheck, check_text, validator

#: whitespace="free": at most this many whitespace characters between two tokens
MAX_WS = 24
#: how the grammar spaces JSON: "spaced" (the default) ``{"a": 1, "b": [1, 2]}``, as json.dumps
#: writes it and as models have mostly seen it; "compact" ``{"a":1,"b":[1,2]}``; "free" any
#: whitespace (up to MAX_WS characters) around each ``{ } [ ] : ,``
WHITESPACE = ("spaced", "compact", "free")
#: string formats with a grammar (a canonical subset of their strings: formats.py)
SUPPORTED_FORMATS = tuple(sorted({*FORMATS, *ALIASES}))
_HEX = "[0-9a-fA-F]"


@dataclass(frozen=True)
class Relaxation:
    """A constraint of the schema that the grammar does not enforce (strict=False): where it
    is (a JSON pointer), its keyword, and why."""

    path: str
    keyword: str
    reason: str


class _Converter(_Rules):
    def __init__(self, root: Any, whitespace: str, strict: bool = True) -> None:
        super().__init__()
        self.root = root
        self.whitespace = whitespace
        self.strict = strict
        self.relaxed: dict[tuple[str, str], Relaxation] = {}
        self.ref_rules: dict[str, str] = {}
        self.unsat_refs: dict[str, str] = {}
        self.regex_nodes: dict[tuple, Node | None] = {}
        self.validator: Any = None

    def matches(self, value: Any, schema: Any) -> bool:
        """Whether a value is valid against a subschema (jsonschema, references resolved in root)."""
        if self.validator is None:
            self.validator = validator(self.root)
        return bool(self.validator.evolve(schema=schema).is_valid(value))

    def relax(self, err: UnenforceableSchemaError) -> None:
        """strict: refuse the constraint; else leave it to the check of the finished output."""
        if self.strict:
            raise err
        key = (err.path or "#", err.keyword or "?")
        if key not in self.relaxed:
            self.relaxed[key] = Relaxation(key[0], key[1], str(err))

    # ---- whitespace and punctuation

    def ws(self) -> Node:
        return self.shared_rule("ws", lambda: _r(("cls", "[ \\t\\n\\r]"), 0, MAX_WS))

    def punct(self, c: str) -> Node:
        """A comma or colon: one space after it when spaced, whitespace around it when free."""
        if self.whitespace == "free":
            return _seq(self.ws(), _lit(c), self.ws())
        return _lit(c + " " if self.whitespace == "spaced" else c)

    def bracket(self, open_: str, content: Node, nullable: bool, close: str) -> Node:
        """``open_ content close``; content may be empty if ``nullable``. Free whitespace: one
        stretch of whitespace where the content would be, else around it; none otherwise."""
        if self.whitespace != "free":
            return _seq(_lit(open_), _opt(content) if nullable else content, _lit(close))
        ws = self.ws()
        if content == EMPTY:
            return _seq(_lit(open_), ws, _lit(close))
        body = _seq(content, ws)
        return _seq(_lit(open_), ws, _opt(body) if nullable else body, _lit(close))

    def comma(self) -> Node:
        return self.punct(",")

    def colon(self) -> Node:
        return self.punct(":")

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

    def integer(self) -> Node:
        return self.shared_rule("integer", lambda: _alt(
            _lit("0"), _seq(_opt(_lit("-")), ("cls", "[1-9]"), _r(("cls", "[0-9]"), 0, MAX_INT_DIGITS - 1))))

    def number(self) -> Node:
        return self.shared_rule("number", lambda: _seq(
            _opt(_lit("-")), _uint(), _frac_opt(),
            _opt(_seq(_lit("e"), _opt(("cls", "[-+]")), _r(("cls", "[0-9]"), 1, MAX_EXP_DIGITS)))))

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
        _check_keywords(schema, path, self.relax)
        rewritten = _negate(schema) if "not" in schema else None
        if rewritten is None and any(k in schema for k in ("dependentRequired", "dependentSchemas", "dependencies")):
            rewritten = _split_dependencies(schema)
        if rewritten is None and "if" in schema:
            rewritten = _split_conditional(schema)
        if rewritten is not None:  # the same constraint in keywords a grammar enforces
            return self.gen(rewritten, hint, path)
        for key in schema:
            if key in _UNSUPPORTED and not (key in ("then", "else") and "if" not in schema):  # (alone: no effect)
                self.relax(_unenforceable(path, key, f"keyword '{key}' is not supported: {_UNSUPPORTED[key]}"))
        if "$ref" in schema:
            ref = schema["$ref"]
            rest = {k: v for k, v in schema.items() if k != "$ref" and _constrains(k)}
            if rest:  # constraints beside $ref apply as well
                # (they stay the containing schema: unevaluatedProperties sees through the allOf)
                return self.gen({**rest, "allOf": [{"$ref": ref}, *rest.get("allOf", ())]}, hint, path)
            return self.ref(ref, path)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.gen_alternatives(schema, key, hint, path)
        if "allOf" in schema:
            return self.gen_all_of(schema, hint, path)
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

    def gen_all_of(self, schema: dict, hint: str, path: str) -> Node:
        """allOf merged into one schema; one rule per distinct schema, so that a recursive $ref
        with keywords beside it (merged inline, not a rule of its own) ends in a rule that refers
        to itself instead of unfolding without end."""
        key = json.dumps(schema, sort_keys=True, default=repr)
        if key in self.unsat_refs:
            raise _Unsat(path, self.unsat_refs[key])
        if key in self.ref_rules:
            return ("ref", self.ref_rules[key])
        name = self.alloc(hint)
        self.ref_rules[key] = name
        try:
            body = self.gen(_merge_all_of(self.root, schema, path, self.relax), hint, path)
        except _Unsat as e:
            self.unsat_refs[key] = str(e)
            del self.ref_rules[key]
            raise
        self.define(name, body, name)
        return ("ref", name)

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

    def ref(self, ref: str, path: str) -> Node:
        try:
            target = _resolve(self.root, ref, path)
        except UnenforceableSchemaError as e:  # another document: any value, checked afterwards
            self.relax(e)
            return self.any_value()
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

    # ---- anyOf / oneOf

    def gen_alternatives(self, schema: dict, key: str, hint: str, path: str) -> Node:
        alts = schema[key]
        exclusive = _exclusive_required(alts) if key == "oneOf" else None
        if exclusive is not None:  # one of some properties: exclusive alternatives
            alts = exclusive
        rest = {k: v for k, v in schema.items() if k != key}
        constrained = any(_constrains(k) for k in rest)
        if constrained:  # S and (A or B) = (S and A) or (S and B)
            alts = [{**rest, "allOf": [a, *rest.get("allOf", ())]} for a in alts]
        if key == "oneOf" and exclusive is None:  # narrowed until no two overlap (else relaxed: as anyOf)
            alts = _exclusive(self.root, alts, path, self.relax, self.matches)
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

    # ---- enum / const

    def gen_enum(self, schema: dict, hint: str, path: str) -> Node:
        others = [k for k in schema if k not in ("enum", "const", "type") and k in _SUPPORTED
                  and k not in _VALUE_CHECKS]
        if others:
            self.relax(_unenforceable(path, others[0], f"'enum'/'const' cannot be combined with {others}: list "
                                                       "only the values that satisfy the other keywords"))
        if "pattern" in schema:
            try:
                self.regex(schema["pattern"], path, "pattern")  # parsed here: an error names the place
            except UnsupportedRegexError as e:  # relaxed: the values are not filtered by it
                self.relax(e)
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
                texts.append(_json_text(v, spaced=self.whitespace == "spaced"))
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
        fmt_pattern = format_pattern(fmt)  # None: a format that only annotates
        if fmt in UNENFORCEABLE_FORMATS:
            self.relax(_unenforceable(path, "format", f"format {fmt!r} is not produced by a grammar (drop it and "
                                                      "check the value after generation)"))
        if "pattern" in schema and fmt_pattern is not None:
            self.relax(_unenforceable(path, "format", f"'pattern' and format {fmt!r} together cannot be "
                                                      "expressed (the strings matching both): keep one of them"))
            fmt_pattern = None  # relaxed: the pattern is enforced
        regex: Regex | None = None
        keyword = "pattern" if "pattern" in schema else "format"
        source = schema["pattern"] if "pattern" in schema else fmt_pattern
        if source is not None:
            try:
                regex = self.regex(source, path, keyword)
            except UnsupportedRegexError as e:  # relaxed: a string without the pattern
                self.relax(e)
        if regex is None:
            if lo == 0 and hi is None:
                return self.string()
            return self.define(hint, _seq(_lit('"'), self.rep(self.char(), lo, hi, "char"), _lit('"')))
        what = f"'pattern' {source!r}" if keyword == "pattern" else f"format {fmt!r}"
        if not regex.admits_length(lo, hi):
            raise _Unsat(path, f"{what} matches no string of {lo} to {hi} characters")
        name = hint if keyword == "pattern" else ALIASES.get(str(fmt), str(fmt))
        node = self.regex_rules(regex, lo, hi, name)
        if node is None:
            self.relax(_unenforceable(
                path, keyword, f"{what} cannot be combined with minLength/maxLength ({lo}..{hi}): the converter fits "
                "lengths only by changing the counts of repetitions; write the length into the pattern "
                "('[a-z]{1,8}') instead"))
            node = self.regex_rules(regex, 0, None, name)  # relaxed: the lengths are not enforced
        if node is None:
            raise _Unsat(path, f"{what} matches no string")
        return self.define(name, node)

    def regex_rules(self, regex: Regex, lo: int, hi: int | None, name: str) -> Node | None:
        key = (regex.source, lo, hi, name)
        if key not in self.regex_nodes:  # the same pattern or format again: the same rules
            self.regex_nodes[key] = regex_node(regex, lo, hi, self.rep, self.define, name)
        return self.regex_nodes[key]

    def gen_number(self, t: str, schema: dict, hint: str, path: str) -> Node:
        lo, hi = _bounds(schema, path)
        frac_digits = MAX_FRAC_DIGITS
        limit = _INT_MAX + 1  # |value| below this
        if "multipleOf" in schema:
            m = _as_number(schema["multipleOf"], path, "multipleOf")
            if m <= 0:
                raise _err(path, "'multipleOf' must be > 0")
            tenths = _tenths(m)
            if t == "integer" and (1 / m).denominator == 1:
                pass  # every integer is a multiple
            elif t == "number" and tenths is not None and tenths <= MAX_SAFE_DIGITS - 1:
                # multiples of 10^-s: at most s fraction digits, and at most 15 significant digits
                # in all, so that the text's double reads back as the same decimal
                frac_digits = tenths
                if tenths:
                    limit = 10 ** (MAX_SAFE_DIGITS - tenths)
            else:
                self.relax(_unenforceable(path, "multipleOf", f"'multipleOf' {schema['multipleOf']!r} is not "
                                          "supported (only powers of ten such as 0.01 or 1 on numbers, and "
                                          "where every integer is a multiple on integers); drop it and check the "
                                          "value after generation"))
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
        if lo is None and hi is None and frac_digits == MAX_FRAC_DIGITS:
            return self.number()
        # every bound as an inclusive decimal threshold (exact for how jsonschema compares)
        high = limit - Fraction(1, 10 ** frac_digits)
        low = -high
        for key, lower in (("minimum", True), ("exclusiveMinimum", True), ("maximum", False),
                           ("exclusiveMaximum", False)):
            value = schema.get(key)
            if value is None or isinstance(value, bool):
                continue
            exclusive = key.startswith("exclusive") or schema.get("exclusiveM" + key[1:]) is True
            # a bound beyond the range written (10**400 has no double) acts as one at its edge
            value = min(max(value, -limit), limit)
            if lower:
                low = max(low, lower_threshold(value, exclusive, frac_digits))
            else:
                high = min(high, upper_threshold(value, exclusive, frac_digits))
        alts = decimal_range(low, high, frac_digits) if low <= high else []
        if not alts:
            raise _Unsat(path, "no number lies between minimum and maximum")
        return self.define(hint, _alt(*alts))

    def regex(self, pattern: Any, path: str, keyword: str) -> Regex:
        try:
            return parse_regex(pattern)
        except UnsupportedRegexError as e:
            raise UnsupportedRegexError(f"JSON Schema at {path}: {e}", e.construct, keyword, path) from None

    # ---- objects

    def gen_object(self, schema: dict, hint: str, path: str) -> Node:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        patterns = []
        for p, sub in schema.get("patternProperties", {}).items():
            try:
                patterns.append((self.regex(p, f"{path}/patternProperties", "patternProperties"), sub))
            except UnsupportedRegexError as e:  # relaxed: keys of that pattern are not produced
                self.relax(e)
        addl = schema.get("additionalProperties")
        if addl is None:
            addl = schema.get("unevaluatedProperties")
        if addl is None:  # absent: none when properties are listed (canonical form), else anything
            addl = False if "properties" in schema or patterns else True
        names = list(props) + [r for r in required if r not in props]
        fields: list[tuple[Node, bool]] = []
        for name in names:
            # a declared name is checked by its properties schema and by every pattern it matches;
            # additionalProperties only applies to names that are neither
            matching = [sub for rx, sub in patterns if rx.search(name)]
            sub = _all_of([props[name] if name in props else (True if matching else addl), *matching])
            is_req = name in required
            sub_path = f"{path}/properties/{_pointer_escape(name)}"
            try:
                value = self.gen(sub, f"{hint}-{name}", sub_path)
            except _Unsat as e:
                if is_req:
                    raise _Unsat(sub_path, f"required property {name!r} admits no value ({e})") from None
                continue
            fields.append((_seq(_lit(_json_text(name)), self.colon(), value), is_req))
        extras: list[Node] = []
        if patterns:
            extras = self.pattern_extras(patterns, names, hint, path)
        elif addl is not False:
            try:
                value = self.gen(addl, f"{hint}-value", f"{path}/additionalProperties")
            except _Unsat:
                pass  # no value is allowed: no other properties
            else:
                key = self.key_excluding(names, f"{hint}-key") if names else self.string()
                extras.append(_seq(key, self.colon(), value))
        extra = self.simple(_alt(*extras), f"{hint}-extra") if extras else None
        n_req = sum(1 for _, r in fields if r)
        nonempty = False
        if "minProperties" in schema:
            m = _as_count(schema["minProperties"], path, "minProperties")
            if m == 1 and n_req == 0:  # at least one of the optional properties (or another key)
                if not fields and extra is None:
                    raise _Unsat(path, "'minProperties' 1, but no property is allowed")
                nonempty = True
            elif m > n_req:
                self.relax(_unenforceable(path, "minProperties", f"'minProperties' {m} is more than the {n_req} "
                                          "required properties; the grammar counts optional ones only for "
                                          "'minProperties' 1: list enough properties in 'required'"))
        max_extra = None
        if "maxProperties" in schema:
            m = _as_count(schema["maxProperties"], path, "maxProperties")
            if m < n_req:
                raise _Unsat(path, f"'maxProperties' {m} is less than the required properties")
            if extra is not None and n_req == len(fields):  # all declared ones present: count the others
                max_extra = m - n_req
                if max_extra == 0:
                    extra = None
            elif extra is not None or m < len(fields):
                self.relax(_unenforceable(path, "maxProperties", f"'maxProperties' {m} cannot be expressed (the "
                                          "object may have more properties); drop it, or set "
                                          f"'additionalProperties': false and list at most {m} properties"))
        return self.define(hint, self.object_body(fields, extra, hint, nonempty, max_extra))

    def pattern_extras(self, patterns: list[tuple[Regex, Any]], names: list[str], hint: str, path: str
                       ) -> list[Node]:
        """The other properties an object with patternProperties has: for each pattern, keys that
        match it, with values of its schema and of the schemas of the patterns the key may match
        too. Keys that match no pattern are not produced (a narrowing, whatever
        additionalProperties says), nor keys of a pattern that a declared name also matches
        (unless every key matches it): they could repeat a declared key."""
        out = []
        for i, (rx, sub) in enumerate(patterns):
            if rx.universal:
                key = self.key_excluding(names, f"{hint}-key") if names else self.string()
            elif any(rx.search(n) for n in names):
                continue
            else:
                found = regex_node(rx, 0, None, self.rep, self.define, f"{hint}-key")
                if found is None:
                    continue
                key = found
            others = [s for j, (ry, s) in enumerate(patterns) if j != i and may_overlap(rx, ry)]
            try:
                value = self.gen(_all_of([sub, *others]), f"{hint}-value",
                                 f"{path}/patternProperties/{_pointer_escape(rx.source)}")
            except _Unsat:
                continue
            out.append(_seq(key, self.colon(), value))
        return out

    def object_body(self, fields: list[tuple[Node, bool]], extra: Node | None, hint: str, nonempty: bool = False,
                    max_extra: int | None = None) -> Node:
        """The members of an object: ``fields`` (key-value, required?) in order, then any number
        (at most ``max_extra``) of ``extra`` ones; with ``nonempty``, at least one member."""
        comma = self.comma()
        more = self.rep(_seq(comma, extra), 0, max_extra, f"{hint}-more") if extra is not None else EMPTY
        if any(r for _, r in fields):
            first = next(i for i, (_, r) in enumerate(fields) if r)
            parts = [_opt(_seq(kv, comma)) for kv, _ in fields[:first]] + [fields[first][0]]
            parts += [_seq(comma, kv) if r else _opt(_seq(comma, kv)) for kv, r in fields[first + 1:]]
            return self.bracket("{", _seq(*parts, more), False, "}")
        kvs = [kv for kv, _ in fields]
        if len(kvs) <= 4:  # one alternative per first property present
            alts = [_seq(kv, *(_opt(_seq(comma, k)) for k in kvs[i + 1:]), more) for i, kv in enumerate(kvs)]
            if extra is not None:
                alts.append(_seq(extra, more if max_extra is None else
                                 self.rep(_seq(comma, extra), 0, max_extra - 1, f"{hint}-more")))
            return self.bracket("{", _alt(*alts) if alts else EMPTY, not nonempty, "}")
        # the same in rules linear in the number of properties: rest[i] = the properties from i on,
        # each after a comma; first[i] = the first present one from i on, then rest
        tail: Node = more
        head: Node = _seq(extra, more) if extra is not None else EMPTY
        for i in reversed(range(len(kvs))):
            after = tail
            tail = self.define(f"{hint}-rest", _seq(_opt(_seq(comma, kvs[i])), tail))
            head = self.define(f"{hint}-first", _alt(_seq(kvs[i], after), head) if head != EMPTY
                               else _seq(kvs[i], after))
        return self.bracket("{", head, not nonempty, "}")

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
            self.relax(_unenforceable(path, "uniqueItems", "'uniqueItems': true is not supported (a grammar "
                                      "cannot compare items); drop it and check after generation, or use "
                                      "'prefixItems' with distinct 'const's"))
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


class SchemaGrammar:
    """A JSON Schema compiled to a grammar (``compile_json_schema``): ``gbnf`` the grammar,
    ``relaxed`` the constraints it does not enforce (strict=False; empty when ``exact``), and
    ``check(text)``, the finished output checked against the whole schema."""

    def __init__(self, schema: Any, gbnf: str, strict: bool, relaxed: tuple[Relaxation, ...]) -> None:
        self.schema = schema
        self.gbnf = gbnf
        self.strict = strict
        self.relaxed = relaxed
        self._validator: Any = None

    @property
    def exact(self) -> bool:
        """Whether the grammar enforces the whole schema (every output it allows is valid)."""
        return not self.relaxed

    def check(self, text: str) -> SchemaCheck:
        """Whether ``text`` is an instance of the schema (jsonschema; see validation.py)."""
        if self._validator is None:
            try:
                self._validator = validator(self.schema)
            except Exception as e:  # noqa: BLE001 - a schema jsonschema cannot load
                return SchemaCheck(None, f"the schema could not be loaded by jsonschema: {type(e).__name__}: {e}")
        return check_text(self._validator, text)

    def __repr__(self) -> str:
        return f"SchemaGrammar({len(self.gbnf)} characters of GBNF, strict={self.strict}, relaxed={len(self.relaxed)})"


def compile_json_schema(schema: Union[dict, bool], *, whitespace: str = "spaced", strict: bool = True) -> SchemaGrammar:
    """The grammar of the canonical JSON texts of the instances of ``schema``, and what it does
    not enforce.

    whitespace  "spaced" (default): one space after each ``,`` and ``:``, none elsewhere
                (``{"a": 1, "b": [1, 2]}``, json.dumps's spelling: small models write valid
                documents more often in it than compactly, docs/structured-output.md);
                "compact": no whitespace at all (``{"a":1,"b":[1,2]}``); both force every
                whitespace token. "free": up to 24 whitespace characters (space, tab, newline,
                CR) around each ``{ } [ ] : ,`` (never before or after the whole value), so
                pretty-printed output (``json.dumps(x, indent=2)``) is accepted too.
    strict   True: a constraint a grammar cannot enforce (``uniqueItems: true``, an overlapping
             ``oneOf``, ``not``, a lookahead in a pattern...) raises UnenforceableSchemaError.
             False: the grammar enforces everything else (exactly) and ``relaxed`` lists what it
             left out; check the output with ``check`` (Session.generate does:
             ``Generation.schema_valid``).

    Raises GrammarError for an invalid or unsatisfiable schema, and UnenforceableSchemaError
    (with strict) as above; docs/structured-output.md lists what is enforced.
    """
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"a JSON Schema must be a dict or a bool, got {type(schema).__name__}")
    if whitespace not in WHITESPACE:
        raise ValueError(f"whitespace must be one of {', '.join(WHITESPACE)}, got {whitespace!r}")
    original = schema
    try:
        check_json(schema)
        schema = local_refs(schema)
        conv = _Converter(schema, whitespace, bool(strict))
        name = conv.alloc("root")
        conv.ref_rules["#"] = name
        conv.define("root", conv.gen(schema, "root", "#"), "root")
        gbnf = conv.finish()
    except _Unsat as e:
        raise GrammarError(f"the JSON Schema admits no value: {e}. Fix the schema (a required property "
                           "or type that cannot be satisfied)") from None
    except RecursionError:
        raise GrammarError("the JSON Schema is nested too deeply to convert") from None
    return SchemaGrammar(original, gbnf, bool(strict), tuple(conv.relaxed.values()))


def json_schema_to_gbnf(schema: Union[dict, bool], *, whitespace: str = "spaced", strict: bool = True) -> str:
    """The GBNF grammar (llama.cpp's format, rule ``root``) of the canonical JSON texts of the
    instances of ``schema``: ``compile_json_schema(...).gbnf`` (see there)."""
    return compile_json_schema(schema, whitespace=whitespace, strict=strict).gbnf


#: any JSON value, canonical (spaced) form (what ``json_schema=True`` uses)
JSON_GBNF: str = json_schema_to_gbnf(True)
