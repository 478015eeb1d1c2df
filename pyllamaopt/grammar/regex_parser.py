"""The parser of regular expressions: ECMA-262 syntax (the subset schemas use: classes,
escapes, quantifiers, groups, alternation, anchors) to a small tree, or an
UnsupportedRegexError naming the construct.

    tree:  ("set", ranges)  ("seq", items)  ("alt", items)  ("rep", tree, lo, hi)  ("bol",)  ("eol",)
"""
from __future__ import annotations

from ..errors import UnsupportedRegexError
from .regex_charsets import (LINE_TERMINATORS, MAX_CP, Ranges, code_points, complement, escape_class, normalize,
                             union)

Tree = tuple


def unsupported_construct(pattern: str, pos: int, construct: str, advice: str = "") -> UnsupportedRegexError:
    where = f" at position {pos}" if pos >= 0 else ""
    return UnsupportedRegexError(f"regular expression {pattern!r}: {construct}{where} "
                                 f"cannot be turned into grammar rules{advice}", construct=construct)


def _invalid(pattern: str, pos: int, why: str) -> UnsupportedRegexError:
    return UnsupportedRegexError(f"regular expression {pattern!r} is not valid ECMA-262: {why} at position "
                                 f"{pos}", construct=f"invalid: {why}")


_SIMPLE_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D}
_HEX_DIGITS = "0123456789abcdefABCDEF"


class Parser:
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
                    raise unsupported_construct(self.p, start, "a quantified anchor")
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
                    raise unsupported_construct(self.p, start, "a lookahead '(?=' / '(?!'")
                elif rest.startswith(("?<=", "?<!")):
                    raise unsupported_construct(self.p, start, "a lookbehind '(?<=' / '(?<!'")
                elif rest.startswith("?<"):
                    end = self.p.find(">", self.i)
                    if end < 0:
                        raise _invalid(self.p, start, "unterminated group name")
                    self.i = end + 1
                else:
                    raise unsupported_construct(self.p, start, "a group modifier '(?...'", " (not ECMA-262)")
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
            return ("set", complement(LINE_TERMINATORS))
        if c == "^":
            return ("bol",)
        if c == "$":
            return ("eol",)
        if c in "*+?" or (c == "{" and self.braces_at(start)):
            raise _invalid(self.p, start, "nothing to repeat")
        if c == "\\":
            both, _ = self.escape(start, in_class=False)
            return ("set", both)
        return ("set", code_points(ord(c)))

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
            return escape_class(c)
        if c == "b" and in_class:
            return code_points(0x08), code_points(0x08)
        if c in "bB":
            raise unsupported_construct(self.p, start, f"a word boundary '\\{c}'")
        if c in _SIMPLE_ESCAPES:
            return code_points(_SIMPLE_ESCAPES[c]), code_points(_SIMPLE_ESCAPES[c])
        if c == "0" and not self.peek().isdigit():
            return code_points(0), code_points(0)
        if c.isdigit():
            raise unsupported_construct(self.p, start, f"a backreference '\\{c}'")
        if c == "k":
            raise unsupported_construct(self.p, start, "a named backreference '\\k'")
        if c in "pP":
            raise unsupported_construct(self.p, start, f"a Unicode property escape '\\{c}{{...}}'",
                                        ": list the characters in a class instead")
        if c == "c" and self.peek().isascii() and self.peek().isalpha():
            cp = ord(self.peek()) % 32
            self.i += 1
            return code_points(cp), code_points(cp)
        if c == "x":
            digits = self.p[self.i:self.i + 2]
            if len(digits) == 2 and all(d in _HEX_DIGITS for d in digits):
                self.i += 2
                return code_points(int(digits, 16)), code_points(int(digits, 16))
            raise _invalid(self.p, start, "'\\x' needs two hex digits")
        if c == "u":
            cp = self.unicode_escape(start)
            return code_points(cp), code_points(cp)
        if c.isalnum() or c == "_":
            raise unsupported_construct(self.p, start, f"the escape '\\{c}'",
                                        " (its meaning differs between regex engines): write the character itself")
        return code_points(ord(c)), code_points(ord(c))

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
            raise unsupported_construct(self.p, start, "an empty class '[]' / '[^]'", " (engines read it differently)")
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
                    raise unsupported_construct(self.p, dash, "a range with a class escape ('\\d-x')")
                if item[2] > end[2]:
                    raise _invalid(self.p, dash, "range out of order in character class")
                r = normalize([(item[2], end[2])])
                both.append(r)
                either.append(r)
            else:
                both.append(item[0])
                either.append(item[1])
        if negated:
            return complement(union(*either))
        return union(*both)

    def class_atom(self) -> tuple[Ranges, Ranges, int | None]:
        """One class member: (both, either, its code point if it is a single character)."""
        start = self.i
        c = self.peek()
        self.i += 1
        if c == "\\":
            both, either = self.escape(start, in_class=True)
            single = both[0][0] if len(both) == 1 and both[0][0] == both[0][1] and both == either else None
            return both, either, single
        s = code_points(ord(c))
        return s, s, ord(c) if s else None
