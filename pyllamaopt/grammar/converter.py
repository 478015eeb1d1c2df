"""The conversion: a JSON Schema, keyword by keyword, to the rule of each subschema ($ref,
allOf, anyOf/oneOf, enum/const, then one rule per type: the per-type classes it is built from)."""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from ..errors import UnenforceableSchemaError, UnsupportedRegexError
from .arrays import ArrayRules
from .composition import exclusive_alternatives, merge_all_of
from .gbnf import Node, alt, is_atom, literal, seq
from .json_values import json_key, json_kind, json_text
from .numbers import NumberRules
from .objects import ObjectRules
from .rewrites import exclusive_required, negate, split_conditional, split_dependencies
from .schema import (ARRAY_KEYWORDS, NUMBER_KEYWORDS, OBJECT_KEYWORDS, STRING_KEYWORDS, SUPPORTED_KEYWORDS,
                     UNSUPPORTED_KEYWORDS, VALUE_CHECKS, Unsatisfiable, check_keywords, constrains, kinds_of_type,
                     resolve, schema_error, schema_types, unenforceable, value_ok)


class Converter(ObjectRules, ArrayRules, NumberRules):
    """One schema's conversion: ``gen`` reads a subschema's keywords and gives its rule, through
    the rules of its types; ``$ref`` targets and merged allOfs get a rule each (recursion ends in them)."""

    def __init__(self, root: Any, whitespace: str, strict: bool = True) -> None:
        super().__init__(root, whitespace, strict)
        self.ref_rules: dict[str, str] = {}
        self.unsat_refs: dict[str, str] = {}

    def boolean(self) -> Node:
        return self.shared_rule("boolean", lambda: alt(literal("true"), literal("false")))

    def any_value(self) -> Node:
        if "value" in self.shared:
            return self.shared["value"]
        name = self.alloc("value")
        value = ("ref", name)
        self.shared["value"] = value
        obj = self.shared_rule("object", lambda: self.object_body([], self.any_kv(value, None), "object"))
        arr = self.shared_rule("array", lambda: self.array_body([], value, 0, None, "array"))
        self.define("value", alt(obj, arr, self.string(), self.number(), self.boolean(), literal("null")), name)
        return value

    def any_kv(self, value: Node, key: Node | None) -> Node:
        return seq(key or self.string(), self.colon(), value)

    # ---- schemas

    def gen(self, schema: Any, hint: str, path: str) -> Node:
        if schema is True:
            return self.any_value()
        if schema is False:
            raise Unsatisfiable(path, "the schema is 'false'")
        if not isinstance(schema, dict):
            raise schema_error(path, f"a schema must be an object or a boolean, got {type(schema).__name__}")
        check_keywords(schema, path, self.relax)
        rewritten = negate(schema) if "not" in schema else None
        if rewritten is None and any(k in schema for k in ("dependentRequired", "dependentSchemas", "dependencies")):
            rewritten = split_dependencies(schema)
        if rewritten is None and "if" in schema:
            rewritten = split_conditional(schema)
        if rewritten is not None:  # the same constraint in keywords a grammar enforces
            return self.gen(rewritten, hint, path)
        for key in schema:
            if key in UNSUPPORTED_KEYWORDS and not (key in ("then", "else") and "if" not in schema):
                # (then/else alone have no effect)
                self.relax(unenforceable(path, key, f"keyword '{key}' is not supported: {UNSUPPORTED_KEYWORDS[key]}"))
        if "$ref" in schema:
            ref = schema["$ref"]
            rest = {k: v for k, v in schema.items() if k != "$ref" and constrains(k)}
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
        last: Unsatisfiable | None = None
        for t in types:
            try:
                branches.append(self.gen_type(t, schema, hint if len(types) == 1 else f"{hint}-{t}", path))
            except Unsatisfiable as e:
                last = e
        if not branches:
            raise last or Unsatisfiable(path, "no type admits a value")
        if len(branches) == 1:
            return branches[0]
        return self.define(hint, alt(*branches))

    def gen_all_of(self, schema: dict, hint: str, path: str) -> Node:
        """allOf merged into one schema; one rule per distinct schema, so that a recursive $ref
        with keywords beside it (merged inline, not a rule of its own) ends in a rule that refers
        to itself instead of unfolding without end."""
        key = json.dumps(schema, sort_keys=True, default=repr)
        if key in self.unsat_refs:
            raise Unsatisfiable(path, self.unsat_refs[key])
        if key in self.ref_rules:
            return ("ref", self.ref_rules[key])
        name = self.alloc(hint)
        self.ref_rules[key] = name
        try:
            body = self.gen(merge_all_of(self.root, schema, path, self.relax), hint, path)
        except Unsatisfiable as e:
            self.unsat_refs[key] = str(e)
            del self.ref_rules[key]
            raise
        self.define(name, body, name)
        return ("ref", name)

    def types(self, schema: dict, path: str) -> list[str] | None:
        types = schema_types(schema, path)
        if types is None:
            # no 'type': the keywords tell which types are meant (a narrowing: others are not produced)
            types = [t for t, keys in (("object", OBJECT_KEYWORDS), ("array", ARRAY_KEYWORDS),
                                       ("string", STRING_KEYWORDS), ("number", NUMBER_KEYWORDS))
                     if any(k in schema for k in keys)]
            if not types:
                return None
        if "number" in types and "integer" in types:
            types.remove("integer")  # number includes the integers
        return types

    # ---- $ref

    def ref(self, ref: str, path: str) -> Node:
        try:
            target = resolve(self.root, ref, path)
        except UnenforceableSchemaError as e:  # another document: any value, checked afterwards
            self.relax(e)
            return self.any_value()
        if ref in self.unsat_refs:
            raise Unsatisfiable(path, self.unsat_refs[ref])
        if ref in self.ref_rules:
            return ("ref", self.ref_rules[ref])
        last = unquote(ref[1:]).rsplit("/", 1)[-1]
        name = self.alloc("root" if ref == "#" else last or "ref")
        self.ref_rules[ref] = name
        try:
            body = self.gen(target, name, ref)
        except Unsatisfiable as e:
            self.unsat_refs[ref] = str(e)
            del self.ref_rules[ref]
            raise
        self.define(name, body, name)
        return ("ref", name)

    # ---- anyOf / oneOf

    def gen_alternatives(self, schema: dict, key: str, hint: str, path: str) -> Node:
        alts = schema[key]
        exclusive = exclusive_required(alts) if key == "oneOf" else None
        if exclusive is not None:  # one of some properties: exclusive alternatives
            alts = exclusive
        rest = {k: v for k, v in schema.items() if k != key}
        constrained = any(constrains(k) for k in rest)
        if constrained:  # S and (A or B) = (S and A) or (S and B)
            alts = [{**rest, "allOf": [a, *rest.get("allOf", ())]} for a in alts]
        if key == "oneOf" and exclusive is None:  # narrowed until no two overlap (else relaxed: as anyOf)
            alts = exclusive_alternatives(self.root, alts, path, self.relax, self.matches)
        branches = []
        last: Unsatisfiable | None = None
        for i, alternative in enumerate(alts):
            try:
                branches.append(self.gen(alternative, f"{hint}-{i}", f"{path}/{key}/{i}"))
            except Unsatisfiable as e:
                last = e
        if not branches:
            raise last or Unsatisfiable(path, f"no '{key}' alternative admits a value")
        node = alt(*branches)
        return node if is_atom(node) else self.define(hint, node)

    # ---- enum / const

    def gen_enum(self, schema: dict, hint: str, path: str) -> Node:
        others = [k for k in schema if k not in ("enum", "const", "type") and k in SUPPORTED_KEYWORDS
                  and k not in VALUE_CHECKS]
        if others:
            self.relax(unenforceable(path, others[0], f"'enum'/'const' cannot be combined with {others}: list "
                                     "only the values that satisfy the other keywords"))
        if "pattern" in schema:
            try:
                self.regex(schema["pattern"], path, "pattern")  # parsed here: an error names the place
            except UnsupportedRegexError as e:  # relaxed: the values are not filtered by it
                self.relax(e)
        if "const" in schema:
            values = [schema["const"]]
            if "enum" in schema:
                keys = {json_key(v) for v in schema["enum"]}
                values = [v for v in values if json_key(v) in keys]
        else:
            values = list(schema["enum"])
        values = [v for v in values if value_ok(v, schema, path)]
        types = schema_types(schema, path)
        if types is not None:
            kinds = set().union(*(kinds_of_type(t) for t in types))
            values = [v for v in values if json_kind(v) in kinds]
            if "integer" in types and "number" not in types:
                values = [int(v) if isinstance(v, float) else v for v in values]
        seen, texts = set(), []
        for v in values:
            if json_kind(v) is None:
                raise schema_error(path, f"enum/const value {v!r} is not a JSON value")
            if json_key(v) not in seen:
                seen.add(json_key(v))
                texts.append(json_text(v, spaced=self.whitespace in ("spaced", "indented")))
        if not texts:
            raise Unsatisfiable(path, "no 'enum'/'const' value is allowed (by 'type')")
        node = alt(*(literal(t) for t in texts))
        return node if is_atom(node) else self.define(hint, node)

    # ---- per type

    def gen_type(self, t: str, schema: dict, hint: str, path: str) -> Node:
        if t == "null":
            return literal("null")
        if t == "boolean":
            return self.boolean()
        if t == "string":
            return self.gen_string(schema, hint, path)
        if t in ("integer", "number"):
            return self.gen_number(t, schema, hint, path)
        if t == "object":
            return self.gen_object(schema, hint, path)
        return self.gen_array(schema, hint, path)
