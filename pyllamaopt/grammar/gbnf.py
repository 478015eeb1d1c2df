"""GBNF expressions (llama.cpp's grammar format): small immutable trees, rendered to GBNF at
the end, and what the checks of a finished grammar need to know of them.

    ("lit", text) ("cls", "[...]") ("ref", name) ("seq", items) ("alt", items) ("rep", x, lo, hi)
"""
from __future__ import annotations

Node = tuple
EMPTY: Node = ("seq", ())


def literal(text: str) -> Node:
    return ("lit", text) if text else EMPTY


def seq(*items: Node) -> Node:
    out: list[Node] = []
    for item in items:
        for part in (item[1] if item[0] == "seq" else (item,)):
            if out and out[-1][0] == "lit" and part[0] == "lit":
                out[-1] = ("lit", out[-1][1] + part[1])
            else:
                out.append(part)
    return out[0] if len(out) == 1 else ("seq", tuple(out))


def alt(*items: Node) -> Node:
    """Alternation; an empty alternative makes the whole optional."""
    out: dict[Node, None] = {}  # in order, each once (a list's `in` made a 200k-value enum take minutes)
    empty = False
    for item in items:
        for part in (item[1] if item[0] == "alt" else (item,)):
            if part == EMPTY:
                empty = True
            else:
                out[part] = None
    if not out:
        return EMPTY
    parts = tuple(out)
    node = parts[0] if len(parts) == 1 else ("alt", parts)
    return optional(node) if empty else node


def repeat(node: Node, lo: int, hi: int | None) -> Node:
    """Repetition within llama.cpp's limits (callers make sure of them)."""
    if hi == 0 or node == EMPTY:
        return EMPTY
    if lo == 1 and hi == 1:
        return node
    if node[0] == "rep" and node[2] == 0 and node[3] == 1 and lo == 0 and hi == 1:
        return node
    return ("rep", node, lo, hi)


def optional(node: Node) -> Node:
    return repeat(node, 0, 1)


def is_atom(node: Node) -> bool:
    return node[0] in ("lit", "cls", "ref")


def gbnf_char(c: str, in_class: bool) -> str:
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


def render(node: Node, ctx: str = "top") -> str:
    kind = node[0]
    if kind == "lit":
        return '"' + "".join(gbnf_char(c, False) for c in node[1]) + '"'
    if kind in ("cls", "ref"):
        return node[1]
    if kind == "seq":
        if not node[1]:
            return '""'
        text = " ".join(render(p, "seq") for p in node[1])
        return f"({text})" if ctx == "rep" else text
    if kind == "alt":
        text = " | ".join(render(p, "alt") for p in node[1])
        return text if ctx == "top" else f"({text})"
    if kind == "rep":
        child, lo, hi = node[1], node[2], node[3]
        inner = render(child, "rep")
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


def walk_refs(node: Node, out: list[str]) -> None:
    kind = node[0]
    if kind == "ref":
        out.append(node[1])
    elif kind in ("seq", "alt"):
        for p in node[1]:
            walk_refs(p, out)
    elif kind == "rep":
        walk_refs(node[1], out)


def is_nullable(node: Node, nullable: set[str]) -> bool:
    kind = node[0]
    if kind in ("lit", "cls"):
        return False
    if kind == "ref":
        return node[1] in nullable
    if kind == "seq":
        return all(is_nullable(p, nullable) for p in node[1])
    if kind == "alt":
        return any(is_nullable(p, nullable) for p in node[1])
    return node[2] == 0 or is_nullable(node[1], nullable)


def is_productive(node: Node, prod: set[str]) -> bool:
    kind = node[0]
    if kind in ("lit", "cls"):
        return True
    if kind == "ref":
        return node[1] in prod
    if kind == "seq":
        return all(is_productive(p, prod) for p in node[1])
    if kind == "alt":
        return any(is_productive(p, prod) for p in node[1])
    return node[2] == 0 or is_productive(node[1], prod)


def left_refs(node: Node, nullable: set[str], out: set[str]) -> bool:
    """Adds the rules that can start ``node`` to ``out``; returns whether node is nullable."""
    kind = node[0]
    if kind in ("lit", "cls"):
        return False
    if kind == "ref":
        out.add(node[1])
        return node[1] in nullable
    if kind == "seq":
        for p in node[1]:
            if not left_refs(p, nullable, out):
                return False
        return True
    if kind == "alt":
        result = False
        for p in node[1]:
            result = left_refs(p, nullable, out) or result
        return result
    return left_refs(node[1], nullable, out) or node[2] == 0
