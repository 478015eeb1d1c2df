"""Sets of code points (a regular expression's character classes) as sorted ranges, and the
classes of the escapes \\d \\w \\s as both ECMA-262 and Python's ``re`` read them."""
from __future__ import annotations

import functools
from typing import Callable

Ranges = tuple  # sorted, disjoint, non-adjacent (lo, hi) code point ranges; never a surrogate

MAX_CP = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


def normalize(ranges: list[tuple[int, int]]) -> Ranges:
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


def union(*sets: Ranges) -> Ranges:
    return normalize([r for s in sets for r in s])


def complement(s: Ranges) -> Ranges:
    out, start = [], 0
    for lo, hi in s:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CP:
        out.append((start, MAX_CP))
    return normalize(out)


def intersect(a: Ranges, b: Ranges) -> Ranges:
    return complement(union(complement(a), complement(b)))


def code_points(*cps: int) -> Ranges:
    return normalize([(c, c) for c in cps])


def contains(s: Ranges, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in s)


ANY: Ranges = complement(())
LINE_TERMINATORS = code_points(0x0A, 0x0D, 0x2028, 0x2029)
_ECMA_SPACE = normalize([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                         (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)])
_ASCII_DIGIT = normalize([(0x30, 0x39)])
_ASCII_WORD = normalize([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])


@functools.lru_cache(maxsize=None)
def _python_class(test: Callable[[str], bool]) -> Ranges:
    """The code points a str predicate holds for (Python's re: \\d isdecimal, \\w isalnum or
    '_', \\s isspace)."""
    return normalize([(c, c) for c in range(MAX_CP + 1) if not 0xD800 <= c <= 0xDFFF and test(chr(c))])


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


def escape_class(letter: str) -> tuple[Ranges, Ranges]:
    """(what both engines read as the class, what either engine does): a positive class takes
    the first, a negated class excludes the second."""
    name = letter.lower()
    if name == "d":
        both, either = _ASCII_DIGIT, union(_ASCII_DIGIT, _python_class(str.isdecimal))
    elif name == "w":
        both, either = _ASCII_WORD, union(_ASCII_WORD, _python_class(_is_word))
    else:
        py_space = _python_class(str.isspace)
        both, either = intersect(_ECMA_SPACE, py_space), union(_ECMA_SPACE, py_space)
    if letter.isupper():
        return complement(either), complement(both)
    return both, either
