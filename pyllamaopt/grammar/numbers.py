"""The rules of a number or integer schema, in canonical form: the digit limits, the decimal
texts of the integers or numbers in a range, and minimum/maximum/multipleOf."""
from __future__ import annotations

import math
from fractions import Fraction

from .base import ConverterBase
from .gbnf import EMPTY, Node, alt, literal, optional, repeat, seq
from .schema import Unsatisfiable, as_number, bounds, schema_error, unenforceable

#: integers (and the integer part of numbers) have at most this many digits
MAX_INT_DIGITS = 16
#: at most this many digits after the decimal point
MAX_FRAC_DIGITS = 20
#: at most this many digits in an exponent
MAX_EXP_DIGITS = 3
_INT_MAX = 10 ** MAX_INT_DIGITS - 1
#: decimals of at most this many significant digits read back from their double unchanged
MAX_SAFE_DIGITS = 15


def _tenths(m: Fraction) -> int | None:
    """s if m is 10^-s (s >= 0), else None."""
    s = 0
    while m.denominator != 1 or m.numerator != 1:
        if m.numerator != 1 or m.denominator % 10:
            return None
        m *= 10
        s += 1
    return s


def _uint() -> Node:
    return alt(literal("0"), seq(("cls", "[1-9]"), repeat(("cls", "[0-9]"), 0, MAX_INT_DIGITS - 1)))


def _frac_opt() -> Node:
    return optional(seq(literal("."), repeat(("cls", "[0-9]"), 1, MAX_FRAC_DIGITS)))


def _uint_range(a: int, b: int) -> list[Node]:
    """Canonical decimal texts (no leading zero) of the integers in [a, b], 0 <= a <= b."""
    alts: list[Node] = []
    full_from: int | None = None  # first length of a run of lengths covered entirely
    if a == 0:
        alts.append(literal("0"))
        if b == 0:
            return alts
        a = 1

    def flush(upto: int) -> None:
        nonlocal full_from
        if full_from is not None:
            alts.append(seq(("cls", "[1-9]"), repeat(("cls", "[0-9]"), full_from - 1, upto - 1)))
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
    return literal(a) if a == b else ("cls", f"[{a}-{b}]")


def _same_length(x: str, y: str) -> list[Node]:
    """Digit strings of the same length between x and y (inclusive)."""
    n = len(x)
    if x == y:
        return [literal(x)]
    if n == 1:
        return [_digits(x, y)]
    if x[0] == y[0]:
        return [seq(literal(x[0]), alt(*_same_length(x[1:], y[1:])))]
    tail_lo, tail_hi = "0" * (n - 1), "9" * (n - 1)
    if x[1:] == tail_lo and y[1:] == tail_hi:
        return [seq(_digits(x[0], y[0]), repeat(("cls", "[0-9]"), n - 1, n - 1))]
    out = []
    first, last = int(x[0]), int(y[0])
    if x[1:] != tail_lo:
        out.append(seq(literal(x[0]), alt(*_same_length(x[1:], tail_hi))))
        first += 1
    if y[1:] != tail_hi:
        last -= 1
    if first <= last:
        out.append(seq(_digits(str(first), str(last)), repeat(("cls", "[0-9]"), n - 1, n - 1)))
    if y[1:] != tail_hi:
        out.append(seq(literal(y[0]), alt(*_same_length(tail_lo, y[1:]))))
    return out


def _int_range(a: int, b: int) -> list[Node]:
    """Canonical decimal texts of the integers in [a, b] ('-0' excluded)."""
    alts: list[Node] = []
    if b >= 0:
        alts += _uint_range(max(a, 0), b)
    if a < 0:
        alts.append(seq(literal("-"), alt(*_uint_range(max(-b, 1), -a))))
    return alts


def lower_threshold(bound: int | float, exclusive: bool, frac_digits: int) -> Fraction:
    """The least decimal T (at most ``frac_digits`` fraction digits) such that every decimal text
    x >= T satisfies ``x >= bound`` (``x > bound`` if exclusive) as jsonschema decides it, whether
    the text is read as an int (compared exactly) or as a float (rounded to nearest, then
    compared exactly). T is the shortest text of D, the first double that satisfies the bound:
    rounding is monotonic, so x >= T gives float(x) >= D; and no integer lies between a double
    and its shortest text. A narrowing only where a text below T rounds onto D."""
    return _threshold(bound, exclusive, frac_digits)


def upper_threshold(bound: int | float, exclusive: bool, frac_digits: int) -> Fraction:
    """The same for ``x <= bound`` (``x < bound``): every decimal text x <= T satisfies it."""
    return -_threshold(-bound, exclusive, frac_digits)


def _threshold(bound: int | float, exclusive: bool, frac_digits: int) -> Fraction:
    exact = Fraction(bound)
    d = float(exact)  # the nearest double; at most a step away from the first one that satisfies
    while Fraction(d) < exact or (exclusive and Fraction(d) == exact):
        d = math.nextafter(d, math.inf)
    while True:
        below = math.nextafter(d, -math.inf)
        if Fraction(below) > exact or (not exclusive and Fraction(below) == exact):
            d = below
        else:
            break
    t = Fraction(d) if d.is_integer() else Fraction(repr(d))
    scale = 10 ** frac_digits
    return Fraction(math.ceil(t * scale), scale)  # (rounded up: still above D)


def _digits_of(f: Fraction) -> str:
    """The fraction digits of 0 <= f < 1 (a finite decimal), without trailing zeros."""
    out = []
    while f:
        f *= 10
        out.append(str(int(f)))
        f -= int(f)
    return "".join(out)


def _fraction_digits(lo: str | None, hi: str | None, n: int, nonempty: bool) -> Node | None:
    """Digit strings r of (1 if nonempty else 0) to n digits with 0.lo <= 0.r <= 0.hi (lo, hi:
    digits without trailing zeros, "" for 0; None: unbounded); None if there is none."""
    if lo == "":
        lo = None
    least = 1 if nonempty else 0
    if lo is None and hi in (None, ""):  # any digits, or only zeros
        return repeat(("cls", "[0-9]") if hi is None else literal("0"), least, n) if n >= least else None
    alts: list[Node] = []
    if not least and lo is None:
        alts.append(EMPTY)
    if n >= 1:
        groups: dict[tuple, list[str]] = {}
        for c in "0123456789":
            if lo is not None and c < lo[0]:
                continue
            top = hi[0] if hi else "0"
            if hi is not None and c > top:
                continue
            key = (lo[1:] or None if lo is not None and c == lo[0] else None,
                   (hi[1:] if hi else "") if hi is not None and c == top else None)
            groups.setdefault(key, []).append(c)
        for (lo2, hi2), cs in groups.items():
            rest = _fraction_digits(lo2, hi2, n - 1, False)
            if rest is not None:
                first: Node = literal(cs[0]) if len(cs) == 1 else ("cls", f"[{cs[0]}-{cs[-1]}]")
                alts.append(seq(first, rest))
    return alt(*alts) if alts else None


def _fraction(lo: str | None, hi: str | None, n: int) -> Node | None:
    """The optional fraction part ('' or '.' and 1 to n digits) of values with fraction digits
    between 0.lo and 0.hi."""
    digits = _fraction_digits(lo, hi, n, True) if n else None
    alts = [EMPTY] if (lo is None or lo == "") else []
    if digits is not None:
        alts.append(seq(literal("."), digits))
    return alt(*alts) if alts else None


def decimal_range(lo: Fraction, hi: Fraction, frac_digits: int) -> list[Node]:
    """Canonical texts without exponent ('-'? int part, then '.' and 1 to frac_digits digits or
    nothing) of the decimals in [lo, hi] (both with at most frac_digits fraction digits, inside
    the integer part's limit). '-0' and '-0.0…' are among them when 0 is."""
    out: list[Node] = []
    if hi >= 0:
        out += _magnitudes(max(lo, Fraction(0)), hi, frac_digits)
    if lo <= 0:
        for x in _magnitudes(max(-hi, Fraction(0)), -lo, frac_digits):
            out.append(seq(literal("-"), x))
    return out


def _magnitudes(a: Fraction, b: Fraction, n: int) -> list[Node]:
    """Texts of the decimals in [a, b], 0 <= a (no sign)."""
    if a > b:
        return []
    ia, ib = math.floor(a), math.floor(b)
    fa, fb = _digits_of(a - ia), _digits_of(b - ib)
    out: list[Node] = []
    if ia == ib:
        f = _fraction(fa, fb, n)
        return [seq(literal(str(ia)), f)] if f is not None else []
    first = ia
    if fa:  # the integer part ia needs a fraction of at least 0.fa
        f = _fraction(fa, None, n)
        if f is not None:
            out.append(seq(literal(str(ia)), f))
        first = ia + 1
    last = ib if fb == "9" * n else ib - 1  # (b = ib.99…9: the integer part ib takes any fraction)
    if first <= last:
        out.append(seq(alt(*_int_range(first, last)), _fraction(None, None, n) or EMPTY))
    if last < ib:
        f = _fraction(None, fb, n)
        if f is not None:
            out.append(seq(literal(str(ib)), f))
    return out


class NumberRules(ConverterBase):
    """A number or integer schema's rule (gen_number); any integer or number in canonical form."""

    def integer(self) -> Node:
        return self.shared_rule("integer", lambda: alt(
            literal("0"),
            seq(optional(literal("-")), ("cls", "[1-9]"), repeat(("cls", "[0-9]"), 0, MAX_INT_DIGITS - 1))))

    def number(self) -> Node:
        return self.shared_rule("number", lambda: seq(
            optional(literal("-")), _uint(), _frac_opt(),
            optional(seq(literal("e"), optional(("cls", "[-+]")), repeat(("cls", "[0-9]"), 1, MAX_EXP_DIGITS)))))

    def gen_number(self, t: str, schema: dict, hint: str, path: str) -> Node:
        lo, hi = bounds(schema, path)
        frac_digits = MAX_FRAC_DIGITS
        limit = _INT_MAX + 1  # |value| below this
        if "multipleOf" in schema:
            m = as_number(schema["multipleOf"], path, "multipleOf")
            if m <= 0:
                raise schema_error(path, "'multipleOf' must be > 0")
            tenths = _tenths(m)
            if t == "integer" and (1 / m).denominator == 1:
                pass  # every integer is a multiple
            elif t == "number" and tenths is not None and tenths <= MAX_SAFE_DIGITS - 1:
                # multiples of 10^-s: at most s fraction digits, and at most 15 significant digits
                # in all, so that the text's double reads back as the same decimal
                frac_digits = tenths
                if tenths:
                    limit = 10 ** (MAX_SAFE_DIGITS - tenths)
            else:
                self.relax(unenforceable(path, "multipleOf", f"'multipleOf' {schema['multipleOf']!r} is not "
                                         "supported (only powers of ten such as 0.01 or 1 on numbers, and "
                                         "where every integer is a multiple on integers); drop it and check the "
                                         "value after generation"))
        if t == "integer":
            if lo is None and hi is None:
                return self.integer()
            a = -math.inf if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
            b = math.inf if hi is None else (math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0]))
            if a > b:
                raise Unsatisfiable(path, "no integer lies between minimum and maximum")
            a, b = max(a, -_INT_MAX), min(b, _INT_MAX)
            if a > b:
                raise schema_error(path, f"the bounds leave no integer of at most {MAX_INT_DIGITS} digits (the limit "
                                   "of the canonical form)")
            return self.define(hint, alt(*_int_range(a, b)))
        if lo is None and hi is None and frac_digits == MAX_FRAC_DIGITS:
            return self.number()
        # every bound as an inclusive decimal threshold (exact for how jsonschema compares)
        high = limit - Fraction(1, 10 ** frac_digits)
        low = -high
        for key, lower in (("minimum", True), ("exclusiveMinimum", True), ("maximum", False),
                           ("exclusiveMaximum", False)):
            value = schema.get(key)
            if value is None or isinstance(value, bool):
                continue
            exclusive = key.startswith("exclusive") or schema.get("exclusiveM" + key[1:]) is True
            # a bound beyond the range written (10**400 has no double) acts as one at its edge
            value = min(max(value, -limit), limit)
            if lower:
                low = max(low, lower_threshold(value, exclusive, frac_digits))
            else:
                high = min(high, upper_threshold(value, exclusive, frac_digits))
        alts = decimal_range(low, high, frac_digits) if low <= high else []
        if not alts:
            raise Unsatisfiable(path, "no number lies between minimum and maximum")
        return self.define(hint, alt(*alts))
