"""Regular expressions of JSON Schema (``pattern``, ``patternProperties``): ECMA-262 syntax (the
subset schemas use: classes, escapes, quantifiers, groups, alternation, anchors) parsed into a
small tree, turned into grammar rules over the characters of a JSON string, and into an
equivalent Python regular expression (to check property names and enum values).

Semantics are those of JSON Schema: a pattern matches if it matches *somewhere* in the string
(``"ab"`` matches ``"xaby"``; ``^`` and ``$`` anchor), characters are code points. Where
ECMA-262 and Python's ``re`` (which jsonschema uses to validate) disagree — ``\\d`` is ASCII in
ECMA-262 and any Unicode digit in Python, ``\\s`` differs in a few characters, ``.`` stops at
``\\r`` and U+2028/9 in ECMA-262 only — a character class keeps only the characters both read
the same way, so every string the grammar allows matches under either engine.

    tree:  ("set", ranges)  ("seq", items)  ("alt", items)  ("rep", tree, lo, hi)  ("bol",)  ("eol",)
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

from ..errors import UnsupportedRegexError
from .gbnf import EMPTY, Node, _alt, _gbnf_char, _lit, _seq

Ranges = tuple  # sorted, disjoint, non-adjacent (lo, hi) code point ranges; never a surrogate
Tree = tuple

MAX_CP = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


# ---- sets of code points


def _norm(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    cut: list[tuple[int, int]] = []
    for lo, hi in out:  # surrogates are not characters
        if hi < _SURROGATES[0] or lo > _SURROGATES[1]:
            cut.append((lo, hi))
        else:
            if lo < _SURROGATES[0]:
                cut.append((lo, _SURROGATES[0] - 1))
            if hi > _SURROGATES[1]:
                cut.append((_SURROGATES[1] + 1, hi))
    return tuple(cut)


def _union(*sets: Ranges) -> Ranges:
    return _norm([r for s in sets for r in s])


def _complement(s: Ranges) -> Ranges:
    out, start = [], 0
    for lo, hi in s:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CP:
        out.append((start, MAX_CP))
    return _norm(out)


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return _complement(_union(_complement(a), _complement(b)))


def _chars(*cps: int) -> Ranges:
    return _norm([(c, c) for c in cps])


def _contains(s: Ranges, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in s)


ANY: Ranges = _complement(())
_LINE_TERMINATORS = _chars(0x0A, 0x0D, 0x2028, 0x2029)
_ECMA_SPACE = _norm([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                     (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)])
_ASCII_DIGIT = _norm([(0x30, 0x39)])
_ASCII_WORD = _norm([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])


@functools.lru_cache(maxsize=None)
def _python_class(test: Callable[[str], bool]) -> Ranges:
    """The code points a str predicate holds for (Python's re: \\d isdecimal, \\w isalnum or
    '_', \\s isspace)."""
    return _norm([(c, c) for c in range(MAX_CP + 1) if not 0xD800 <= c <= 0xDFFF and test(chr(c))])


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _escape_class(letter: str) -> tuple[Ranges, Ranges]:
    """(what both engines read as the class, what either engine does): a positive class takes
    the first, a negated class excludes the second."""
    name = letter.lower()
    if name == "d":
        both, either = _ASCII_DIGIT, _union(_ASCII_DIGIT, _python_class(str.isdecimal))
    elif name == "w":
        both, either = _ASCII_WORD, _union(_ASCII_WORD, _python_class(_is_word))
    else:
        py_space = _python_class(str.isspace)
        both, either = _intersect(_ECMA_SPACE, py_space), _union(_ECMA_SPACE, py_space)
    if letter.isupper():
        return _complement(either), _complement(both)
    return both, either


# ---- parsing


def _unsupported(pattern: str, pos: int, construct: str, advice: str = "") -> UnsupportedRegexError:
    where = f" at position {pos}" if pos >= 0 else ""
    return UnsupportedRegexError(f"regular expression {pattern!r}: {construct}{where} "
                                 f"cannot be turned into grammar rules{advice}", construct=construct)


def _invalid(pattern: str, pos: int, why: str) -> UnsupportedRegexError:
    return UnsupportedRegexError(f"regular expression {pattern!r} is not valid ECMA-262: {why} at position "
                                 f"{pos}", construct=f"invalid: {why}")


_SIMPLE_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D}
_HEX_DIGITS = "0123456789abcdefABCDEF"


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.p[j] if j < len(self.p) else ""

    def parse(self) -> Tree:
        tree = self.alternation()
        if self.i < len(self.p):  # only a ')' stops an alternation early
            raise _invalid(self.p, self.i, "unbalanced ')'")
        return tree

    def alternation(self) -> Tree:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else ("alt", tuple(branches))

    def sequence(self) -> Tree:
        items: list[Tree] = []
        while self.i < len(self.p) and self.peek() not in "|)":
            start = self.i
            atom = self.atom()
            quant = self.quantifier()
            if quant is not None:
                if atom[0] in ("bol", "eol"):
                    raise _unsupported(self.p, start, "a quantified anchor")
                atom = ("rep", atom, quant[0], quant[1])
            items.append(atom)
        return items[0] if len(items) == 1 else ("seq", tuple(items))

    def braces(self) -> tuple[int, int | None, int] | None:
        """{n}, {n,}, {n,m} at the current position: (lo, hi, length), or None (then '{' is a
        literal character, as ECMA-262 Annex B has it)."""
        j = self.i + 1
        k = j
        while k < len(self.p) and self.p[k].isdigit():
            k += 1
        if k == j:
            return None
        lo = int(self.p[j:k])
        if k < len(self.p) and self.p[k] == "}":
            return lo, lo, k + 1 - self.i
        if k >= len(self.p) or self.p[k] != ",":
            return None
        m = k + 1
        while m < len(self.p) and self.p[m].isdigit():
            m += 1
        if m >= len(self.p) or self.p[m] != "}":
            return None
        hi = int(self.p[k + 1:m]) if m > k + 1 else None
        return lo, hi, m + 1 - self.i

    def quantifier(self) -> tuple[int, int | None] | None:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            q: tuple[int, int | None] = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{" and (b := self.braces()) is not None:
            if b[1] is not None and b[1] < b[0]:
                raise _invalid(self.p, self.i, "numbers out of order in {} quantifier")
            self.i += b[2]
            q = (b[0], b[1])
        else:
            return None
        if self.peek() == "?":  # lazy: the same strings
            self.i += 1
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self.braces() is not None):
            raise _invalid(self.p, self.i, "nothing to repeat")
        return q

    def atom(self) -> Tree:
        c = self.peek()
        start = self.i
        self.i += 1
        if c == "(":
            if self.peek() == "?":
                rest = self.p[self.i:self.i + 3]
                if rest.startswith("?:"):
                    self.i += 2
                elif rest.startswith(("?=", "?!")):
                    raise _unsupported(self.p, start, "a lookahead '(?=' / '(?!'")
                elif rest.startswith(("?<=", "?<!")):
                    raise _unsupported(self.p, start, "a lookbehind '(?<=' / '(?<!'")
                elif rest.startswith("?<"):
                    end = self.p.find(">", self.i)
                    if end < 0:
                        raise _invalid(self.p, start, "unterminated group name")
                    self.i = end + 1
                else:
                    raise _unsupported(self.p, start, "a group modifier '(?...'", " (not ECMA-262)")
            inner = self.alternation()
            if self.peek() != ")":
                raise _invalid(self.p, start, "unterminated group")
            self.i += 1
            return inner
        if c == ")":
            raise _invalid(self.p, start, "unbalanced ')'")
        if c == "[":
            return ("set", self.char_class(start))
        if c == ".":
            return ("set", _complement(_LINE_TERMINATORS))
        if c == "^":
            return ("bol",)
        if c == "$":
            return ("eol",)
        if c in "*+?" or (c == "{" and self.braces_at(start)):
            raise _invalid(self.p, start, "nothing to repeat")
        if c == "\\":
            both, _ = self.escape(start, in_class=False)
            return ("set", both)
        return ("set", _chars(ord(c)))

    def braces_at(self, pos: int) -> bool:
        saved, self.i = self.i, pos
        try:
            return self.braces() is not None
        finally:
            self.i = saved

    def escape(self, start: int, in_class: bool) -> tuple[Ranges, Ranges]:
        """After a backslash: (what both engines match, what either engine matches)."""
        c = self.peek()
        if not c:
            raise _invalid(self.p, start, "'\\' at the end")
        self.i += 1
        if c in "dDwWsS":
            return _escape_class(c)
        if c == "b" and in_class:
            return _chars(0x08), _chars(0x08)
        if c in "bB":
            raise _unsupported(self.p, start, f"a word boundary '\\{c}'")
        if c in _SIMPLE_ESCAPES:
            return _chars(_SIMPLE_ESCAPES[c]), _chars(_SIMPLE_ESCAPES[c])
        if c == "0" and not self.peek().isdigit():
            return _chars(0), _chars(0)
        if c.isdigit():
            raise _unsupported(self.p, start, f"a backreference '\\{c}'")
        if c == "k":
            raise _unsupported(self.p, start, "a named backreference '\\k'")
        if c in "pP":
            raise _unsupported(self.p, start, f"a Unicode property escape '\\{c}{{...}}'",
                               ": list the characters in a class instead")
        if c == "c" and self.peek().isascii() and self.peek().isalpha():
            cp = ord(self.peek()) % 32
            self.i += 1
            return _chars(cp), _chars(cp)
        if c == "x":
            digits = self.p[self.i:self.i + 2]
            if len(digits) == 2 and all(d in _HEX_DIGITS for d in digits):
                self.i += 2
                return _chars(int(digits, 16)), _chars(int(digits, 16))
            raise _invalid(self.p, start, "'\\x' needs two hex digits")
        if c == "u":
            cp = self.unicode_escape(start)
            return _chars(cp), _chars(cp)
        if c.isalnum() or c == "_":
            raise _unsupported(self.p, start, f"the escape '\\{c}'",
                               " (its meaning differs between regex engines): write the character itself")
        return _chars(ord(c)), _chars(ord(c))

    def unicode_escape(self, start: int) -> int:
        if self.peek() == "{":
            end = self.p.find("}", self.i)
            digits = self.p[self.i + 1:end] if end > 0 else ""
            if not digits or any(d not in _HEX_DIGITS for d in digits) or int(digits, 16) > MAX_CP:
                raise _invalid(self.p, start, "bad '\\u{...}' escape")
            self.i = end + 1
            return int(digits, 16)
        digits = self.p[self.i:self.i + 4]
        if len(digits) != 4 or any(d not in _HEX_DIGITS for d in digits):
            raise _invalid(self.p, start, "'\\u' needs four hex digits")
        self.i += 4
        cp = int(digits, 16)
        low = self.p[self.i:self.i + 6]
        if 0xD800 <= cp <= 0xDBFF and low.startswith("\\u") and all(d in _HEX_DIGITS for d in low[2:]) \
                and len(low) == 6 and 0xDC00 <= int(low[2:], 16) <= 0xDFFF:
            self.i += 6  # a surrogate pair: one code point
            cp = 0x10000 + ((cp - 0xD800) << 10) + (int(low[2:], 16) - 0xDC00)
        return cp

    def char_class(self, start: int) -> Ranges:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        if self.peek() == "]":
            raise _unsupported(self.p, start, "an empty class '[]' / '[^]'", " (engines read it differently)")
        both: list[Ranges] = []
        either: list[Ranges] = []
        while True:
            c = self.peek()
            if not c:
                raise _invalid(self.p, start, "unterminated character class")
            if c == "]":
                self.i += 1
                break
            item = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                dash = self.i
                self.i += 1
                end = self.class_atom()
                if item[2] is None or end[2] is None:
                    raise _unsupported(self.p, dash, "a range with a class escape ('\\d-x')")
                if item[2] > end[2]:
                    raise _invalid(self.p, dash, "range out of order in character class")
                r = _norm([(item[2], end[2])])
                both.append(r)
                either.append(r)
            else:
                both.append(item[0])
                either.append(item[1])
        if negated:
            return _complement(_union(*either))
        return _union(*both)

    def class_atom(self) -> tuple[Ranges, Ranges, int | None]:
        """One class member: (both, either, its code point if it is a single character)."""
        start = self.i
        c = self.peek()
        self.i += 1
        if c == "\\":
            both, either = self.escape(start, in_class=True)
            single = both[0][0] if len(both) == 1 and both[0][0] == both[0][1] and both == either else None
            return both, either, single
        s = _chars(ord(c))
        return s, s, ord(c) if s else None


# ---- the parsed expression


def _branches(tree: Tree) -> list[Tree]:
    return [b for part in tree[1] for b in _branches(part)] if tree[0] == "alt" else [tree]


def _items(tree: Tree) -> list[Tree]:
    """The parts of a sequence (nested sequences, from groups, flattened)."""
    return [x for t in tree[1] for x in _items(t)] if tree[0] == "seq" else [tree]


def _has_anchor(tree: Tree) -> bool:
    kind = tree[0]
    if kind in ("bol", "eol"):
        return True
    if kind in ("seq", "alt"):
        return any(_has_anchor(t) for t in tree[1])
    if kind == "rep":
        return _has_anchor(tree[1])
    return False


def _length(tree: Tree) -> tuple[int, int | None]:
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
            a, b = _length(t)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if kind == "alt":
        ranges = [_length(t) for t in tree[1]]
        top = [b for _, b in ranges]
        return min(a for a, _ in ranges), None if None in top else max(b for b in top if b is not None)
    a, b = _length(tree[1])
    return a * tree[2], None if tree[3] is None or b is None else b * tree[3]


def _empty(tree: Tree) -> bool:
    """Whether the tree matches no string at all (a class with no character)."""
    kind = tree[0]
    if kind == "set":
        return not tree[1]
    if kind == "seq":
        return any(_empty(t) for t in tree[1])
    if kind == "alt":
        return all(_empty(t) for t in tree[1])
    if kind == "rep":
        return tree[2] > 0 and _empty(tree[1])
    return False


def _first(items: list[Tree]) -> tuple[Ranges, bool]:
    """The characters a match of the items can start with, and whether a match can be empty."""
    acc: Ranges = ()
    for t in items:
        f, nullable = _first_one(t)
        acc = _union(acc, f)
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
        return _union(*(f for f, _ in firsts)), any(n for _, n in firsts)
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
            core_can_be_empty = _length(("seq", b.items))[0] == 0
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
        return _union(*out)

    def admits_length(self, lo: int, hi: int | None) -> bool:
        """Whether some matching string has between lo and hi characters."""
        for b in self.branches:
            a, z = _length(("seq", b.items))
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
    return fa is None or fb is None or bool(_intersect(fa, fb))


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
    tree = _Parser(pattern).parse()
    branches = []
    for branch in _branches(tree):
        items = _items(branch)
        start = end = False
        while items and items[0] == ("bol",):
            items, start = items[1:], True
        while items and items[-1] == ("eol",):
            items, end = items[:-1], True
        if any(_has_anchor(t) for t in items):
            raise _unsupported(pattern, -1, "an anchor ('^' or '$') inside the pattern",
                               ": anchors are supported at the start and end of each alternative")
        if not _empty(("seq", tuple(items))):
            branches.append(_Branch(tuple(items), start, end))
    return Regex(pattern, tuple(branches))


# ---- grammar rules


_SHORT_ESCAPES = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"}
_RAW_EXCLUDED = _norm([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])


def _class_text(ranges: Ranges) -> str:
    def one(cp: int) -> str:
        return _gbnf_char(chr(cp), True)

    def body(rs: Ranges) -> str:
        return "".join(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}" for lo, hi in rs)

    negated = _complement(ranges)
    if len(negated) < len(ranges):
        return f"[^{body(negated)}]"
    return f"[{body(ranges)}]"


@functools.lru_cache(maxsize=4096)
def json_char_node(ranges: Ranges) -> Node:
    """The JSON string spellings of one character of the set: the character itself, or, for
    '"', '\\' and control characters, its escape (one canonical spelling each: the short
    escape where there is one, else \\u00xx)."""
    alts: list[Node] = []
    raw = _intersect(ranges, _complement(_RAW_EXCLUDED))
    if len(raw) == 1 and raw[0][0] == raw[0][1]:
        alts.append(_lit(chr(raw[0][0])))
    elif raw:
        alts.append(("cls", _class_text(raw)))
    long_escapes: dict[int, list[int]] = {}
    for cp in range(0x20):
        if _contains(ranges, cp) and cp not in _SHORT_ESCAPES:
            long_escapes.setdefault(cp >> 4, []).append(cp & 15)
    for cp, text in _SHORT_ESCAPES.items():
        if _contains(ranges, cp):
            alts.append(_lit(text))
    for high, lows in sorted(long_escapes.items()):
        alts.append(_seq(_lit(f"\\u00{high}"), ("cls", _class_text(_chars(*(ord("0123456789abcdef"[d]) for d in lows))))))
    return _alt(*alts) if alts else EMPTY


Rep = Callable[[Node, int, int | None, str], Node]
Define = Callable[[str, Node], Node]


def _tree_node(tree: Tree, rep: Rep, define: Define, hint: str) -> Node:
    kind = tree[0]
    if kind == "set":
        node = json_char_node(tree[1])
        return node if node[0] != "alt" else define(f"{hint}-char", node)
    if kind == "seq":
        return _seq(*(_tree_node(t, rep, define, hint) for t in tree[1]))
    if kind == "alt":
        return _alt(*(_tree_node(t, rep, define, hint) for t in tree[1] if not _empty(t)))
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
        items = _items(capped)
    total_lo = sum(_length(t)[0] for t in items)
    if total_lo >= lo:
        return items
    growable = []  # (index, width, min count, max count or None)
    for i, t in enumerate(items):
        if t[0] == "rep":
            a, b = _length(t[1])
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
    a, b = _length(tree)
    if b is not None and b <= budget:
        return tree
    if a > budget:
        return None
    kind = tree[0]
    if kind == "alt":
        kept = [c for c in (_cap(t, budget) for t in tree[1]) if c is not None]
        return ("alt", tuple(kept)) if kept else None
    if kind == "seq":
        lengths = [_length(t) for t in tree[1]]
        spare = budget - sum(x for x, _ in lengths)
        extra = _share(spare, [1] * len(lengths), [None if y is None else y - x for x, y in lengths])
        capped = [_cap(t, x + e) for t, (x, _), e in zip(tree[1], lengths, extra)]
        return None if any(c is None for c in capped) else ("seq", tuple(capped))
    if kind == "rep":
        child, m, n = tree[1], tree[2], tree[3]
        ca, cb = _length(child)
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
        a, z = _length(("seq", tuple(items)))
        if a < lo or (hi is not None and (z is None or z > hi)):
            fitted = _fit(items, lo, hi)
            if fitted is None:
                continue
            items = fitted
        alts.append(_tree_node(("seq", tuple(items)), rep, define, hint))
    if not alts:
        return None
    return _seq(_lit('"'), _alt(*alts), _lit('"'))
