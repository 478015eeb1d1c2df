"""Keywords a grammar cannot enforce as written, rewritten into ones it can (exactly, or as a
narrowing): dependentRequired/dependentSchemas/dependencies, not, if/then/else, and a oneOf of
single required properties."""
from __future__ import annotations

from .schema import TYPES, constrains

#: at most this many dependencies are split into alternatives (each one doubles them)
MAX_DEPENDENCIES = 4


def _without_property(schema: dict, name: str) -> dict:
    """The schema with property ``name`` forbidden. Where the schema lists no properties this
    lists one (``name: false``), which in the canonical form also ends other extra keys: a
    narrowing."""
    return {**schema, "properties": {**schema.get("properties", {}), name: False}}


def split_dependencies(schema: dict) -> dict | None:
    """dependentRequired / dependentSchemas / draft-4 dependencies as alternatives: the
    property absent, or present with what it brings (``{"anyOf": [...]}``; exact). None if the
    schema has none, or too many to split (the caller relaxes them)."""
    for key in ("dependentRequired", "dependentSchemas", "dependencies"):
        deps = schema.get(key)
        if not isinstance(deps, dict) or not deps:
            continue
        if sum(len(v) for k, v in schema.items() if k in ("dependentRequired", "dependentSchemas", "dependencies")
               and isinstance(v, dict)) > MAX_DEPENDENCIES:
            return None
        name, dep = next(iter(deps.items()))
        rest = {k: v for k, v in schema.items() if k != key}
        if len(deps) > 1:
            rest[key] = {k: v for k, v in deps.items() if k != name}
        required = list(rest.get("required", []))
        if isinstance(dep, list):
            present = {**rest, "required": required + [x for x in [name, *dep] if x not in required and x != ""]}
            present["required"] = list(dict.fromkeys(present["required"]))
        else:
            present = {**rest, "required": list(dict.fromkeys([*required, name])),
                       "allOf": [*rest.get("allOf", []), dep]}
        if name in required:
            return present
        return {"anyOf": [_without_property(rest, name), present]}
    return None


def negate(schema: dict) -> dict | None:
    """``not`` where its schema is one a grammar can complement: {} or false (nothing / anything),
    ``required`` (some of them absent), ``type`` (the other types). None otherwise."""
    neg = schema["not"]
    rest = {k: v for k, v in schema.items() if k != "not"}
    if neg is False:
        return rest
    if neg is True or neg == {}:
        return {"anyOf": [False]}  # nothing is valid
    if not isinstance(neg, dict):
        return None
    keys = [k for k in neg if constrains(k)]
    if keys == ["required"] and isinstance(neg["required"], list) and neg["required"]:
        alts = [_without_property(rest, name) for name in neg["required"] if isinstance(name, str)]
        return alts[0] if len(alts) == 1 else {"anyOf": alts}
    if keys == ["type"]:
        banned = neg["type"] if isinstance(neg["type"], list) else [neg["type"]]
        allowed = rest.get("type", list(TYPES))
        allowed = allowed if isinstance(allowed, list) else [allowed]
        if "number" in banned:
            banned = [*banned, "integer"]
        kept = [t for t in allowed if t not in banned]
        if "integer" in banned and "number" in kept:  # numbers that are not integers: not expressible
            return None
        return {**rest, "type": kept} if kept else {"anyOf": [False]}  # (no type left: nothing)
    return None


def exclusive_required(alts: list) -> list | None:
    """oneOf alternatives that each only require one property, as alternatives that are
    exclusive: that property present and the others absent (exact). None otherwise."""
    names = []
    for alt in alts:
        if not isinstance(alt, dict) or [k for k in alt if constrains(k)] != ["required"]:
            return None
        req = alt["required"]
        if not (isinstance(req, list) and len(req) == 1 and isinstance(req[0], str)):
            return None
        names.append(req[0])
    if len(set(names)) != len(names):
        return None
    return [{"required": [n], "properties": {m: False for m in names if m != n}} for n in names]


def split_conditional(schema: dict) -> dict | None:
    """if/then/else as alternatives: (if and then) or (not if, and else), where ``not if`` is one
    negate can write (exact). None otherwise."""
    rest = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
    cond, then, other = schema["if"], schema.get("then", True), schema.get("else", True)
    unless = negate({**rest, "not": cond})
    if unless is None:
        return None
    yes = {**rest, "allOf": [*rest.get("allOf", []), cond, then]}
    return {"anyOf": [yes, unless if other is True else {"allOf": [unless, other]}]}
