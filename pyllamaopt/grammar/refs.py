"""Identifiers and references: the base URI of every subschema (``$id``, draft-04 ``id``), its
anchors (``$anchor``, ``$dynamicAnchor``, ``$id: "#name"``), and every ``$ref`` that names a
place in the same document rewritten as a local JSON pointer (``#/definitions/a``), so that the
converter resolves references one way only. References to other documents are left as they are
(the converter refuses or relaxes them)."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote, urldefrag, urljoin

# keywords whose value is a schema, a list of schemas, or an object of schemas: where $id and
# $ref are looked for (a "$ref" inside an enum value or an annotation is data, not a reference)
_SCHEMA = ("additionalProperties", "unevaluatedProperties", "additionalItems", "unevaluatedItems", "contains",
           "propertyNames", "not", "if", "then", "else")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _join(base: str, ref: str) -> str:
    if ref.startswith("#"):
        return urldefrag(base)[0] + ref
    if _SCHEME.match(ref):
        return ref
    return urljoin(base, ref)


def _subschemas(node: dict, pointer: str) -> list[tuple[Any, str]]:
    """The direct subschemas of a schema object, with their JSON pointers."""
    out: list[tuple[Any, str]] = []
    for key, value in node.items():
        p = f"{pointer}/{_escape(key)}"
        if key in _SCHEMA or (key == "items" and isinstance(value, dict)):
            out.append((value, p))
        elif key in _SCHEMA_LISTS or (key == "items" and isinstance(value, list)):
            if isinstance(value, list):
                out += [(v, f"{p}/{i}") for i, v in enumerate(value)]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out += [(v, f"{p}/{_escape(k)}") for k, v in value.items() if isinstance(k, str)]
    return out


def follow(root: Any, pointer: str) -> Any:
    """The value a JSON pointer ('' or '/a/0/b~1c') names in root; KeyError naming the first part
    that is not there."""
    node = root
    for part in pointer.split("/")[1:] if pointer else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(part)
    return node


def _exists(root: Any, pointer: str) -> bool:
    try:
        follow(root, pointer)
    except KeyError:
        return False
    return True


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _own_id(node: dict, draft4: bool) -> str | None:
    ident = node.get("$id")
    if not isinstance(ident, str) and draft4:
        ident = node.get("id")
    return ident if isinstance(ident, str) else None


def _is_draft4(root: dict) -> bool:
    """Draft 3/4 schemas name themselves with ``id``; so do schemas without ``$schema`` that use
    ``id`` and never ``$id`` (common in the wild)."""
    dialect = root.get("$schema")
    if isinstance(dialect, str):
        return "draft-04" in dialect or "draft-03" in dialect
    return "$id" not in root


def local_refs(root: Any) -> Any:
    """``root`` with every resolvable ``$ref`` rewritten as ``#`` + a JSON pointer into root
    (a copy; root itself is not changed). Returns root unchanged when it has no ``$id``/``id``,
    no anchors and no reference that needs rewriting."""
    if not isinstance(root, dict):
        return root
    draft4 = _is_draft4(root)
    resources: dict[str, str] = {}  # absolute URI (no fragment) -> pointer
    anchors: dict[str, str] = {}    # absolute URI with '#name' -> pointer
    bases: dict[str, str] = {}      # pointer of every schema object -> its base URI
    root_base = ""

    def index(node: Any, pointer: str, base: str) -> None:
        if not isinstance(node, dict):
            return
        ident = _own_id(node, draft4)
        if ident is not None:
            uri, frag = urldefrag(_join(base, ident))
            if frag:  # draft 6/7 (and 4) plain-name fragment: an anchor in the current resource
                anchors.setdefault(_join(base, "#" + frag), pointer)
            else:
                base = uri
                resources.setdefault(uri, pointer)
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(key), str):
                anchors.setdefault(_join(base, "#" + node[key]), pointer)
        bases[pointer] = base
        for sub, p in _subschemas(node, pointer):
            index(sub, p, base)

    ident = _own_id(root, draft4)
    if ident is not None:
        root_base = urldefrag(ident)[0]
    index(root, "", "")
    resources.setdefault(root_base, "")
    resources.setdefault("", "")

    def target(ref: str, base: str) -> str | None:
        absolute = _join(base, ref)
        uri, frag = urldefrag(absolute)
        if "#" in absolute and frag and not frag.startswith("/"):
            return anchors.get(absolute)
        if uri not in resources:
            return None
        pointer = resources[uri] + unquote(frag)
        return pointer if _exists(root, pointer) else None

    changed = False

    def rewrite(node: Any, pointer: str, outer: str) -> Any:
        nonlocal changed
        if not isinstance(node, dict):
            return node
        out = dict(node)
        ref = node.get("$ref")
        if isinstance(ref, str):
            found = target(ref, bases.get(pointer, root_base))
            if found is None:  # up to draft 7 an '$id' beside '$ref' is ignored: the enclosing base
                found = target(ref, outer)
            if found is not None:
                local = "#" + quote(found, safe="/~!$&'()*+,;=:@")
                if local != ref:
                    out["$ref"] = local
                    changed = True
        base = bases.get(pointer, root_base)
        for key, value in node.items():
            p = f"{pointer}/{_escape(key)}"
            if key in _SCHEMA or (key == "items" and isinstance(value, dict)):
                out[key] = rewrite(value, p, base)
            elif (key in _SCHEMA_LISTS or key == "items") and isinstance(value, list):
                out[key] = [rewrite(v, f"{p}/{i}", base) for i, v in enumerate(value)]
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {k: rewrite(v, f"{p}/{_escape(k)}", base) if isinstance(k, str) else v
                            for k, v in value.items()}
        return out

    result = rewrite(root, "", root_base)
    return result if changed else root
