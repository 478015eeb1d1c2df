"""Regular expressions of JSON Schema (``pattern``, ``patternProperties``), parsed
(regex_parser.py) into a Regex: its alternatives with their anchors, what they can match
(lengths, first characters), and an equivalent Python regular expression (to check property
names and enum values). regex_rules.py turns a Regex into grammar rules.

Semantics are those of JSON Schema: a pattern matches if it matches *somewhere* in the string
(``"ab"`` matches ``"xaby"``; ``^`` and ``$`` anchor), characters are code points. Where
ECMA-262 and Python's ``re`` (which jsonschema uses to validate) disagree — ``\\d`` is ASCII in
ECMA-262 and any Unicode digit in Python, ``\\s`` differs in a few characters, ``.`` stops at
``\\r`` and U+2028/9 in ECMA-262 only — a character class keeps only the characters both read
the same way, so every string the grammar allows matches under either engine.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..errors import UnsupportedRegexError
from .regex_charsets import ANY, Ranges, intersect, union
from .regex_parser import Parser, Tree, unsupported_construct


def _branches(tree: Tree) -> list[Tree]:
    return [b for part in tree[1] for b in _branches(part)] if tree[0] == "alt" else [tree]


def sequence_items(tree: Tree) -> list[Tree]:
    """The parts of a sequence (nested sequences, from groups, flattened)."""
    return [x for t in tree[1] for x in sequence_items(t)] if tree[0] == "seq" else [tree]


def _has_anchor(tree: Tree) -> bool:
    kind = tree[0]
    if kind in ("bol", "eol"):
        return True
    if kind in ("seq", "alt"):
        return any(_has_anchor(t) for t in tree[1])
    if kind == "rep":
        return _has_anchor(tree[1])
    return False


def match_length(tree: Tree) -> tuple[int, int | None]:
    """The fewest and most characters the tree matches (None: unbounded)."""
    kind = tree[0]
    if kind == "set":
        return 1, 1
    if kind in ("bol", "eol"):
        return 0, 0
    if kind == "seq":
        lo = 0
        hi: int | None = 0
        for t in tree[1]:
            a, b = match_length(t)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if kind == "alt":
        ranges = [match_length(t) for t in tree[1]]
        top = [b for _, b in ranges]
        return min(a for a, _ in ranges), None if None in top else max(b for b in top if b is not None)
    a, b = match_length(tree[1])
    return a * tree[2], None if tree[3] is None or b is None else b * tree[3]


def matches_nothing(tree: Tree) -> bool:
    """Whether the tree matches no string at all (a class with no character)."""
    kind = tree[0]
    if kind == "set":
        return not tree[1]
    if kind == "seq":
        return any(matches_nothing(t) for t in tree[1])
    if kind == "alt":
        return all(matches_nothing(t) for t in tree[1])
    if kind == "rep":
        return tree[2] > 0 and matches_nothing(tree[1])
    return False


def _first(items: list[Tree]) -> tuple[Ranges, bool]:
    """The characters a match of the items can start with, and whether a match can be empty."""
    acc: Ranges = ()
    for t in items:
        f, nullable = _first_one(t)
        acc = union(acc, f)
        if not nullable:
            return acc, False
    return acc, True


def _first_one(tree: Tree) -> tuple[Ranges, bool]:
    kind = tree[0]
    if kind == "set":
        return tree[1], False
    if kind == "seq":
        return _first(list(tree[1]))
    if kind == "alt":
        firsts = [_first_one(t) for t in tree[1]]
        return union(*(f for f, _ in firsts)), any(n for _, n in firsts)
    if kind == "rep":
        f, nullable = _first_one(tree[1])
        return f, nullable or tree[2] == 0
    return (), True


@dataclass(frozen=True)
class _Branch:
    items: tuple  # trees, no anchors
    start: bool   # anchored with '^'
    end: bool     # anchored with '$'


@dataclass(frozen=True)
class Regex:
    """A parsed ``pattern``: its branches (top-level alternatives) with their anchors."""

    source: str
    branches: tuple  # of _Branch; none that matches nothing

    @property
    def universal(self) -> bool:
        """Whether every string matches (as ``""``, ``.*`` unanchored, ``^[^]*``...)."""
        for b in self.branches:
            core_can_be_empty = match_length(("seq", b.items))[0] == 0
            if core_can_be_empty and not (b.start and b.end):
                return True
            if b.items == (("rep", ("set", ANY), 0, None),):
                return True
        return False

    def first_chars(self) -> Ranges | None:
        """The characters every matching string starts with; None if unknown (unanchored, or a
        match can be empty)."""
        out: list[Ranges] = []
        for b in self.branches:
            f, nullable = _first(list(b.items))
            if not b.start or nullable:
                return None
            out.append(f)
        return union(*out)

    def admits_length(self, lo: int, hi: int | None) -> bool:
        """Whether some matching string has between lo and hi characters."""
        for b in self.branches:
            a, z = match_length(("seq", b.items))
            if (hi is None or a <= hi) and (z is None or z >= lo or not (b.start and b.end)):
                return True
        return False

    def search(self, text: str) -> bool:
        """Whether the pattern matches somewhere in ``text`` (read as the grammar reads it)."""
        return _compiled(self.source).search(text) is not None

    def python(self) -> str:
        """An equivalent Python pattern for ``re.search`` (classes spelled out, so that Python
        reads them exactly as the grammar does)."""
        alts = []
        for b in self.branches:
            core = "".join(_py(t) for t in b.items)
            alts.append(("\\A" if b.start else "") + core + ("\\Z" if b.end else ""))
        return "|".join(alts) if alts else "(?!)"


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> re.Pattern:
    return re.compile(parse_regex(source).python())


def may_overlap(a: Regex, b: Regex) -> bool:
    """False only if no string matches both (told apart by their first characters)."""
    fa, fb = a.first_chars(), b.first_chars()
    return fa is None or fb is None or bool(intersect(fa, fb))


def _py(tree: Tree) -> str:
    kind = tree[0]
    if kind == "set":
        if not tree[1]:
            return "(?!)"
        return "[" + "".join(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in tree[1]) + "]"
    if kind == "seq":
        return "(?:" + "".join(_py(t) for t in tree[1]) + ")"
    if kind == "alt":
        return "(?:" + "|".join(_py(t) for t in tree[1]) + ")"
    if kind == "rep":
        hi = "" if tree[3] is None else str(tree[3])
        return f"(?:{_py(tree[1])}){{{tree[2]},{hi}}}"
    raise AssertionError(tree)


@functools.lru_cache(maxsize=1024)
def parse_regex(pattern: str) -> Regex:
    """Parses an ECMA-262 pattern. Raises UnsupportedRegexError (naming the construct) for what
    cannot become grammar rules, or for a pattern that is not valid."""
    if not isinstance(pattern, str):
        raise UnsupportedRegexError(f"a regular expression must be a string, got {pattern!r}", construct="not a string")
    tree = Parser(pattern).parse()
    branches = []
    for branch in _branches(tree):
        items = sequence_items(branch)
        start = end = False
        while items and items[0] == ("bol",):
            items, start = items[1:], True
        while items and items[-1] == ("eol",):
            items, end = items[:-1], True
        if any(_has_anchor(t) for t in items):
            raise unsupported_construct(pattern, -1, "an anchor ('^' or '$') inside the pattern",
                                        ": anchors are supported at the start and end of each alternative")
        if not matches_nothing(("seq", tuple(items))):
            branches.append(_Branch(tuple(items), start, end))
    return Regex(pattern, tuple(branches))
