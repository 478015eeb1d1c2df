"""Numbers in canonical form: the digit limits, and the decimal texts of the integers or
numbers in a range."""
from __future__ import annotations

from .gbnf import EMPTY, Node, _alt, _lit, _opt, _r, _seq

#: integers (and the integer part of numbers) have at most this many digits
MAX_INT_DIGITS = 16
#: at most this many digits after the decimal point
MAX_FRAC_DIGITS = 20
#: at most this many digits in an exponent
MAX_EXP_DIGITS = 3
#: next to an exclusive bound, a number has at most this many significant digits (a double
#: keeps 15: a longer decimal could be read as the bound itself)


_SAFE_DIGITS = 15


_INT_MAX = 10 ** MAX_INT_DIGITS - 1


def _uint() -> Node:
    return _alt(_lit("0"), _seq(("cls", "[1-9]"), _r(("cls", "[0-9]"), 0, MAX_INT_DIGITS - 1)))


def _frac_opt() -> Node:
    return _opt(_seq(_lit("."), _r(("cls", "[0-9]"), 1, MAX_FRAC_DIGITS)))


def _uint_range(a: int, b: int) -> list[Node]:
    """Canonical decimal texts (no leading zero) of the integers in [a, b], 0 <= a <= b."""
    alts: list[Node] = []
    full_from: int | None = None  # first length of a run of lengths covered entirely
    if a == 0:
        alts.append(_lit("0"))
        if b == 0:
            return alts
        a = 1

    def flush(upto: int) -> None:
        nonlocal full_from
        if full_from is not None:
            alts.append(_seq(("cls", "[1-9]"), _r(("cls", "[0-9]"), full_from - 1, upto - 1)))
            full_from = None

    for n in range(len(str(a)), len(str(b)) + 1):
        lo = max(a, 10 ** (n - 1))
        hi = min(b, 10 ** n - 1)
        if lo > hi:
            continue
        if lo == 10 ** (n - 1) and hi == 10 ** n - 1:
            if full_from is None:
                full_from = n
            continue
        flush(n - 1)
        alts += _same_length(str(lo), str(hi))
    flush(len(str(b)))
    return alts


def _digits(a: str, b: str) -> Node:
    return _lit(a) if a == b else ("cls", f"[{a}-{b}]")


def _same_length(x: str, y: str) -> list[Node]:
    """Digit strings of the same length between x and y (inclusive)."""
    n = len(x)
    if x == y:
        return [_lit(x)]
    if n == 1:
        return [_digits(x, y)]
    if x[0] == y[0]:
        return [_seq(_lit(x[0]), _alt(*_same_length(x[1:], y[1:])))]
    tail_lo, tail_hi = "0" * (n - 1), "9" * (n - 1)
    if x[1:] == tail_lo and y[1:] == tail_hi:
        return [_seq(_digits(x[0], y[0]), _r(("cls", "[0-9]"), n - 1, n - 1))]
    out = []
    first, last = int(x[0]), int(y[0])
    if x[1:] != tail_lo:
        out.append(_seq(_lit(x[0]), _alt(*_same_length(x[1:], tail_hi))))
        first += 1
    if y[1:] != tail_hi:
        last -= 1
    if first <= last:
        out.append(_seq(_digits(str(first), str(last)), _r(("cls", "[0-9]"), n - 1, n - 1)))
    if y[1:] != tail_hi:
        out.append(_seq(_lit(y[0]), _alt(*_same_length(tail_lo, y[1:]))))
    return out


def _int_range(a: int, b: int) -> list[Node]:
    """Canonical decimal texts of the integers in [a, b] ('-0' excluded)."""
    alts: list[Node] = []
    if b >= 0:
        alts += _uint_range(max(a, 0), b)
    if a < 0:
        alts.append(_seq(_lit("-"), _alt(*_uint_range(max(-b, 1), -a))))
    return alts


def _magnitudes(lo: int, lo_excl: bool, hi: int, hi_excl: bool) -> list[Node]:
    """Decimal texts 'I' / 'I.F' (no exponent) of the values in the interval, 0 <= lo <= hi.

    Next to an exclusive bound, at most 15 significant digits: a longer text such as
    1.00000000000000000001 would be read as the double 1.0, on the bound."""
    d = ("cls", "[0-9]")
    zeros = _opt(_seq(_lit("."), _r(_lit("0"), 1, MAX_FRAC_DIGITS)))

    def safe(i: int, above_zero: bool) -> int:  # fraction digits that keep I.F off a bound
        return MAX_FRAC_DIGITS if (i == 0 and above_zero) else _SAFE_DIGITS - (len(str(i)) if i else 0)

    def nonzero(n: int) -> Node:  # '.' and 1..n digits, not all zero
        return _seq(_lit("."), _alt(*(_seq(_r(_lit("0"), k, k), ("cls", "[1-9]"), _r(d, 0, n - 1 - k))
                                      for k in range(n))))

    if lo > hi:
        return []
    if lo == hi:
        return [] if lo_excl or hi_excl else [_seq(_lit(str(lo)), zeros)]
    out = []
    first = lo
    if lo_excl:  # I = lo: the fraction must not be zero
        n = safe(lo, True)
        if hi_excl and hi == lo + 1:
            n = min(n, safe(lo, False))
        if n >= 1:
            out.append(_seq(_lit(str(lo)), nonzero(n)))
        first = lo + 1
    last, top = hi - 1, None
    if hi_excl and hi - 1 >= first:  # I = hi - 1: the fraction must not round up to hi
        n = safe(hi - 1, False)
        top = _seq(_lit(str(hi - 1)), _opt(_seq(_lit("."), _r(d, 1, n))) if n >= 1 else EMPTY)
        last = hi - 2
    if first <= last:
        out.append(_seq(_alt(*_int_range(first, last)), _frac_opt()))
    if top is not None:
        out.append(top)
    if not hi_excl:
        out.append(_seq(_lit(str(hi)), zeros))
    return out
