"""A parsed regular expression (regex.py) as grammar rules over the characters of a JSON
string: each character in its JSON spelling, and the lengths of minLength/maxLength met by
narrowing the counts of the pattern's repetitions."""
from __future__ import annotations

import functools
from typing import Callable

from .gbnf import EMPTY, Node, alt, gbnf_char, literal, seq
from .regex import Regex, match_length, matches_nothing, sequence_items
from .regex_charsets import ANY, Ranges, code_points, complement, contains, intersect, normalize
from .regex_parser import Tree

_SHORT_ESCAPES = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"}
_RAW_EXCLUDED = normalize([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])


def _class_text(ranges: Ranges) -> str:
    def one(cp: int) -> str:
        return gbnf_char(chr(cp), True)

    def body(rs: Ranges) -> str:
        return "".join(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}" for lo, hi in rs)

    negated = complement(ranges)
    if len(negated) < len(ranges):
        return f"[^{body(negated)}]"
    return f"[{body(ranges)}]"


@functools.lru_cache(maxsize=4096)
def json_char_node(ranges: Ranges) -> Node:
    """The JSON string spellings of one character of the set: the character itself, or, for
    '"', '\\' and control characters, its escape (one canonical spelling each: the short
    escape where there is one, else \\u00xx)."""
    alts: list[Node] = []
    raw = intersect(ranges, complement(_RAW_EXCLUDED))
    if len(raw) == 1 and raw[0][0] == raw[0][1]:
        alts.append(literal(chr(raw[0][0])))
    elif raw:
        alts.append(("cls", _class_text(raw)))
    long_escapes: dict[int, list[int]] = {}
    for cp in range(0x20):
        if contains(ranges, cp) and cp not in _SHORT_ESCAPES:
            long_escapes.setdefault(cp >> 4, []).append(cp & 15)
    for cp, text in _SHORT_ESCAPES.items():
        if contains(ranges, cp):
            alts.append(literal(text))
    for high, lows in sorted(long_escapes.items()):
        low_digits = code_points(*(ord("0123456789abcdef"[d]) for d in lows))
        alts.append(seq(literal(f"\\u00{high}"), ("cls", _class_text(low_digits))))
    return alt(*alts) if alts else EMPTY


Rep = Callable[[Node, int, int | None, str], Node]
Define = Callable[[str, Node], Node]


def _tree_node(tree: Tree, rep: Rep, define: Define, hint: str) -> Node:
    kind = tree[0]
    if kind == "set":
        node = json_char_node(tree[1])
        return node if node[0] != "alt" else define(f"{hint}-char", node)
    if kind == "seq":
        return seq(*(_tree_node(t, rep, define, hint) for t in tree[1]))
    if kind == "alt":
        return alt(*(_tree_node(t, rep, define, hint) for t in tree[1] if not matches_nothing(t)))
    if kind == "rep":
        return rep(_tree_node(tree[1], rep, define, hint), tree[2], tree[3], hint)
    raise AssertionError(tree)


def _fit(items: list[Tree], lo: int, hi: int | None) -> list[Tree] | None:
    """The items with the counts of their repetitions changed so that every match has between
    lo and hi characters (a narrowing: the matches of the result are matches of the items), or
    None if changing counts cannot do it. The room is shared out evenly between the parts that
    can vary; to reach ``lo``, repetitions of a fixed-width part are made longer."""
    if hi is not None:
        capped = _cap(("seq", tuple(items)), hi)
        if capped is None:
            return None
        items = sequence_items(capped)
    total_lo = sum(match_length(t)[0] for t in items)
    if total_lo >= lo:
        return items
    growable = []  # (index, width, min count, max count or None)
    for i, t in enumerate(items):
        if t[0] == "rep":
            a, b = match_length(t[1])
            if a == b and a > 0:
                growable.append((i, a, t[2], t[3]))
    more = _share(lo - total_lo, [w for _, w, _, _ in growable],
                  [None if n is None else n - m for _, _, m, n in growable], at_least=True)
    if sum(w * e for (_, w, _, _), e in zip(growable, more)) < lo - total_lo:
        return None
    out = list(items)
    for (i, _, m, n), e in zip(growable, more):
        out[i] = ("rep", items[i][1], m + e, n)
    return out


def _cap(tree: Tree, budget: int) -> Tree | None:
    """The tree narrowed so that no match is longer than ``budget`` characters, or None."""
    a, b = match_length(tree)
    if b is not None and b <= budget:
        return tree
    if a > budget:
        return None
    kind = tree[0]
    if kind == "alt":
        kept = [c for c in (_cap(t, budget) for t in tree[1]) if c is not None]
        return ("alt", tuple(kept)) if kept else None
    if kind == "seq":
        lengths = [match_length(t) for t in tree[1]]
        spare = budget - sum(x for x, _ in lengths)
        extra = _share(spare, [1] * len(lengths), [None if y is None else y - x for x, y in lengths])
        capped = [_cap(t, x + e) for t, (x, _), e in zip(tree[1], lengths, extra)]
        return None if any(c is None for c in capped) else ("seq", tuple(capped))
    if kind == "rep":
        child, m, n = tree[1], tree[2], tree[3]
        ca, cb = match_length(child)
        if ca == cb:  # fixed width: fewer repetitions
            return ("rep", child, m, budget // ca if n is None else min(n, budget // ca))
        count = n if n is not None else max(m, budget // max(4 * ca, 1), 1)
        while count >= max(m, 1):  # fewer repetitions of shorter matches
            c = _cap(child, budget // count)
            if c is not None:
                return ("rep", c, m, count)
            count -= 1
        return ("rep", child, 0, 0) if m == 0 else None
    return None


def _share(chars: int, widths: list[int], caps: list[int | None], at_least: bool = False) -> list[int]:
    """Counts to add to repetitions of the given widths (each at most its cap, None: no cap),
    spread evenly: in total at most ``chars`` characters, or with ``at_least`` at least that
    many if the caps allow (overshooting by less than a width)."""
    extra = [0] * len(widths)
    left = chars
    while left > 0:
        open_ = [i for i, c in enumerate(caps) if (c is None or extra[i] < c) and (at_least or widths[i] <= left)]
        if not open_:
            break
        per = max(left // len(open_), 1)
        for i in open_:
            k = max(per // widths[i], 1)
            if not at_least:
                k = min(k, left // widths[i])
            cap = caps[i]
            if cap is not None:
                k = min(k, cap - extra[i])
            if k <= 0:
                continue
            extra[i] += k
            left -= k * widths[i]
            if left <= 0:
                break
    return extra


def regex_node(regex: Regex, lo: int, hi: int | None, rep: Rep, define: Define, hint: str
               ) -> Node | None:
    """The JSON string (with its quotes) of the strings that match ``regex`` and have between lo
    and hi characters; None if no branch of the pattern can be fitted to those lengths (see
    _fit). The grammar is exact for the pattern; a length bound is met by narrowing the counts
    of the pattern's repetitions (and of the free text around an unanchored pattern)."""
    anything = ("rep", ("set", ANY), 0, None)
    alts = []
    for b in regex.branches:
        items = ([] if b.start else [anything]) + list(b.items) + ([] if b.end else [anything])
        a, z = match_length(("seq", tuple(items)))
        if a < lo or (hi is not None and (z is None or z > hi)):
            fitted = _fit(items, lo, hi)
            if fitted is None:
                continue
            items = fitted
        alts.append(_tree_node(("seq", tuple(items)), rep, define, hint))
    if not alts:
        return None
    return seq(literal('"'), alt(*alts), literal('"'))
