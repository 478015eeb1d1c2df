"""allOf and oneOf reasoned about on the schemas themselves: the members of an allOf merged
into one schema, and whether two schemas are disjoint (oneOf alternatives must be)."""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import GrammarError, UnenforceableSchemaError
from .json_values import ALL_KINDS, json_key, json_kind
from .regex import parse_regex
from .schema import (TYPES, Matches, Relax, Unsatisfiable, check_keywords, constrains, kinds_of_type, refuse,
                     schema_error, schema_types, unenforceable)
from .schema import resolve as _resolve  # (module-private: tests count the references followed through it)


def _flatten_all_of(root: Any, schema: Any, path: str, out: list, refs: tuple, top: bool, relax: Relax,
                    merged: set[str]) -> None:
    """Appends the constraints of `schema` and of what it includes (allOf, $ref) to `out`. `refs`:
    the references being followed (a cycle is an error); `merged`: those already in `out` (allOf is
    idempotent: each once, where a chain of definitions each including the last twice took 2**n)."""
    if schema is True:
        return
    if schema is False:
        raise Unsatisfiable(path, "an 'allOf' member is 'false'")
    if not isinstance(schema, dict):
        raise schema_error(path, f"a schema must be an object or a boolean, got {type(schema).__name__}")
    check_keywords(schema, path, relax)
    if not top:
        for key in ("unevaluatedProperties", "unevaluatedItems"):
            if key in schema and schema[key] is not True:
                relax(unenforceable(path, key, f"'{key}' inside 'allOf' (or beside '$ref') is not supported: "
                                    "it would forbid what the other members allow; move it to the "
                                    "schema that holds the 'allOf'"))
                schema = {k: v for k, v in schema.items() if k != key}
    rest = {k: v for k, v in schema.items() if k not in ("allOf", "$ref") and constrains(k)}
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in refs:
            raise schema_error(path, f"'$ref' {ref!r} includes itself through 'allOf'/'$ref' without "
                               "an enclosing object or array: the schema has no finite instance")
        if ref not in merged:
            merged.add(ref)
            try:
                target = _resolve(root, ref, path)
            except UnenforceableSchemaError as e:  # another document: not checked here
                relax(e)
            else:
                _flatten_all_of(root, target, ref, out, refs + (ref,), False, relax, merged)
    for i, sub in enumerate(schema.get("allOf", ())):
        _flatten_all_of(root, sub, f"{path}/allOf/{i}", out, refs, False, relax, merged)
    if rest:
        out.append(rest)


def merge_all_of(root: Any, schema: dict, path: str, relax: Relax = refuse) -> dict:
    parts: list[dict] = []
    _flatten_all_of(root, schema, path, parts, (), True, relax, set())
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
                    raise schema_error(path, "'prefixItems' must be a list of schemas")
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
                a = schema_types({"type": old}, path) or []
                b = schema_types({"type": value}, path) or []
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
                    raise Unsatisfiable(path, f"'allOf' members require types {a} and {b}")
                merged[key] = both
            elif key == "enum":
                keys = {json_key(v) for v in value}
                merged[key] = [v for v in old if json_key(v) in keys]
            elif key == "const":
                if json_key(old) != json_key(value):
                    raise Unsatisfiable(path, f"'allOf' members require const {old!r} and {value!r}")
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
            elif key == "patternProperties" and isinstance(old, dict) and isinstance(value, dict):
                merged[key] = {**old, **{k: all_of([old[k], v]) if k in old else v for k, v in value.items()}}
            elif key == "uniqueItems":
                merged[key] = old or value
            elif json_key(old) != json_key(value):  # the first value is kept
                relax(unenforceable(path, key, f"'allOf' members give '{key}' different values ({old!r} and "
                                    f"{value!r}); they cannot be merged: write one schema with the "
                                    "combined constraint"))
    if obj_parts:
        # a key of one member is checked by the other members' properties, or else by
        # their additionalProperties (absent: anything)
        names: list[str] = []
        for props, _ in obj_parts:
            if not isinstance(props, dict):
                raise schema_error(path, "'properties' must be an object mapping names to schemas")
            names += [n for n in props if n not in names]
        merged["properties"] = {n: all_of([props[n] if n in props else addl for props, addl in obj_parts])
                                for n in names}
        if any("additionalProperties" in p for p in parts):
            merged["additionalProperties"] = all_of([addl for _, addl in obj_parts])
    if arr_parts:
        # the same for arrays: item i is checked by each member's prefixItems[i], or else its items
        n = max(len(prefix) for prefix, _, _ in arr_parts)
        if n:
            merged["prefixItems"] = [all_of([prefix[i] if i < len(prefix) else rest
                                             for prefix, rest, _ in arr_parts]) for i in range(n)]
        if any(given for _, _, given in arr_parts):
            merged["items"] = all_of([rest for _, rest, _ in arr_parts])
    if deferred:
        merged["allOf"] = deferred
    return merged


def all_of(schemas: list) -> Any:
    """The conjunction of schemas, as a schema: nested conjunctions flattened, repeated members
    once (so that merging a recursive schema with itself does not grow without end)."""
    members: dict[str, Any] = {}
    for s in schemas:
        for m in (s["allOf"] if isinstance(s, dict) and list(s) == ["allOf"] and isinstance(s["allOf"], list)
                  else [s]):
            if m is False:
                return False
            if m is not True:
                members.setdefault(json.dumps(m, sort_keys=True, default=repr), m)
    kept = list(members.values())
    return True if not kept else kept[0] if len(kept) == 1 else {"allOf": kept}


def exclusive_alternatives(root: Any, alts: list, path: str, relax: Relax, matches: Matches) -> list:
    """oneOf alternatives narrowed so that no value of one of them matches another: then "any of
    them" is "exactly one of them", which a grammar enforces. For each pair that may overlap,
    the first alternative is narrowed by a separator (_separator; a narrowing: its values are
    still valid), or, if it lists its values (enum/const), to the values no other alternative
    matches (checked with jsonschema). An alternative that cannot be told apart from another is
    left out (a narrowing too); if that leaves none, the oneOf is left to the check of the output
    (relax) as anyOf: an output could then match two alternatives."""
    views = []
    for alt in alts:
        try:
            if isinstance(alt, dict) and ("allOf" in alt or "$ref" in alt):
                alt = merge_all_of(root, alt, path)
        except Unsatisfiable:
            alt = False
        except GrammarError:
            alt = {}  # not merged: may overlap anything
        views.append(alt)
    out, first_overlap = [], None
    may_overlap = _overlap_candidates(views)
    for i, alt in enumerate(alts):
        narrowings: list = []
        overlapping = []
        for j in may_overlap(i):
            if j == i or _disjoint(root, views[i], views[j], 0):
                continue
            separator = _separator(root, views[i], views[j])
            if separator is None:
                overlapping.append(j)
            elif separator is not True:
                narrowings.append(separator)
        values = _values(views[i]) if isinstance(views[i], dict) else None
        if overlapping and values is not None:  # the values that match no other alternative
            narrowings.append({"enum": [v for v in values
                                        if not any(matches(v, alts[j]) for j in range(len(alts)) if j != i)]})
            overlapping = []
        if overlapping:
            first_overlap = first_overlap or (i, overlapping[0])
        else:
            out.append({"allOf": [alt, *narrowings]} if narrowings else alt)
    if out:
        return out
    assert first_overlap is not None
    relax(unenforceable(path, "oneOf", f"'oneOf' alternatives {first_overlap[0]} and {first_overlap[1]} may both "
                        "match the same value, and a grammar cannot enforce 'exactly one'. Use 'anyOf' if that is "
                        "acceptable, or make them exclusive: different types, or a required property with a "
                        "different 'const'/'enum' in each"))
    return alts


def _overlap_candidates(views: list) -> Callable[[int], Iterable[int]]:
    """For alternative i, the alternatives _disjoint must look at, ascending: two that list their
    values (enum/const) overlap only if they share one, so a listed alternative is compared with
    the listed ones sharing a value and with every unlisted one — linear for a oneOf of thousands
    of constants, which compared every pair."""
    listed = [{json_key(v) for v in values} if isinstance(view, dict) and (values := _values(view)) is not None
              else None for view in views]
    holders: dict = defaultdict(set)
    for j, keys in enumerate(listed):
        for key in keys or ():
            holders[key].add(j)
    unlisted = {j for j, keys in enumerate(listed) if keys is None}

    def candidates(i: int) -> Iterable[int]:
        keys = listed[i]
        if keys is None:
            return range(len(views))
        return sorted(unlisted.union(*(holders[key] for key in keys)))
    return candidates


def _separator(root: Any, a: Any, b: Any) -> Any:
    """A narrowing of schema ``a`` that no value of ``b`` matches: True if ``a`` needs none (a
    property both have, with disjoint values, that one of them requires), else a schema to add
    to ``a``: the types of ``b`` left out; that property required; a property ``b`` requires
    forbidden (objects only, where both admit other kinds too); None if there is none. ``a`` and
    ``b`` are merged views (merge_all_of)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    kinds_a, kinds_b = _kinds(a, root), _kinds(b, root)
    kept = [t for t in TYPES if kinds_of_type(t) <= kinds_a and not kinds_of_type(t) & kinds_b]
    if "number" in kept and "integer" in kept:
        kept.remove("integer")
    if kept:
        return {"type": kept}
    common = kinds_a & kinds_b
    if "object" not in common:
        return None
    objects: dict = {} if common == {"object"} else {"type": "object"}
    pa, pb = a.get("properties", {}), b.get("properties", {})
    ra, rb = a.get("required", []), b.get("required", [])
    if not all(isinstance(x, dict) for x in (pa, pb)) or not all(isinstance(x, list) for x in (ra, rb)):
        return None
    told_apart = [n for n in pa if n in pb and _disjoint(root, pa[n], pb[n], 0)]
    if any(n in ra or n in rb for n in told_apart):
        return objects or True
    if told_apart and pa[told_apart[0]] is not False:
        return {**objects, "required": [told_apart[0]]}
    names = [n for n in rb if isinstance(n, str) and n not in ra]
    if names:
        return {**objects, "properties": {names[0]: False}}
    names = [n for n in pa if pa[n] is not False and _forbids(b, n)]
    if names:  # a property ``b`` forbids, required
        return {**objects, "required": [names[0]]}
    if _closed(a) and _closed(b) and not b.get("patternProperties") and all(_forbids(b, n) for n in pa) \
            and all(_forbids(a, n) for n in pb):  # no key is allowed by both: at least one key
        return {**objects, "minProperties": 1}
    return None


def _closed(schema: dict) -> bool:
    return schema.get("additionalProperties") is False


def _view(root: Any, schema: Any, depth: int) -> Any:
    """A schema with its top-level $ref / allOf resolved, for the disjointness test."""
    if isinstance(schema, dict) and ("$ref" in schema or "allOf" in schema) and depth < 16:
        try:
            return merge_all_of(root, schema, "#")
        except (Unsatisfiable, GrammarError):
            return schema if not isinstance(schema, dict) else {}
    return schema


def _kinds(schema: Any, root: Any = None, depth: int = 0) -> set[str]:
    """JSON kinds a schema admits (a superset: exact semantics, not our narrowing); with the
    root, the alternatives of an anyOf/oneOf are looked into."""
    if schema is False:
        return set()
    if not isinstance(schema, dict):
        return set(ALL_KINDS)
    kinds = set(ALL_KINDS)
    t = schema.get("type")
    if isinstance(t, str):
        t = [t]
    if isinstance(t, list) and all(x in TYPES for x in t):
        kinds = set().union(*(kinds_of_type(x) for x in t))
    values = _values(schema)
    if values is not None:
        kinds &= {json_kind(v) for v in values}
    for key in ("anyOf", "oneOf"):
        if root is not None and isinstance(schema.get(key), list) and depth < 8:
            kinds &= set().union(*(_kinds(_view(root, alt, depth + 1), root, depth + 1) for alt in schema[key]))
    return kinds


def _values(schema: dict) -> list | None:
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return schema["enum"]
    return None


def _disjoint(root: Any, a: Any, b: Any, depth: int) -> bool:
    """True only if no value matches both schemas (exact JSON Schema semantics)."""
    a, b = _view(root, a, depth), _view(root, b, depth)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not ({json_key(v) for v in va} & {json_key(v) for v in vb}):
        return True
    common = _kinds(a, root, depth) & _kinds(b, root, depth)
    if not common:
        return True
    if common != {"object"} or depth > 8:
        return False
    pa, pb = a.get("properties", {}), b.get("properties", {})
    ra, rb = a.get("required", []), b.get("required", [])
    if not (isinstance(pa, dict) and isinstance(pb, dict) and isinstance(ra, list) and isinstance(rb, list)):
        return False
    if any(_forbids(b, n) for n in ra) or any(_forbids(a, n) for n in rb):
        return True
    return any(name in pb and name in ra and name in rb and _disjoint(root, pa[name], pb[name], depth + 1)
               for name in pa)


def _forbids(schema: dict, name: Any) -> bool:
    """Whether an object valid against ``schema`` cannot have property ``name``."""
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not isinstance(name, str):
        return False
    if name in props:
        return props[name] is False
    if schema.get("additionalProperties") is not False:
        return False
    patterns = schema.get("patternProperties", {})
    try:
        return isinstance(patterns, dict) and not any(parse_regex(p).search(name) for p in patterns)
    except GrammarError:  # a pattern not understood: it may match
        return False
