"""A small, independent GBNF implementation for the tests: a parser that follows llama.cpp's
(src/llama-grammar.cpp: escapes, repetition rewriting and its limits, left recursion), an
Earley recognizer (does the grammar's ``root`` match a whole string?) and a random sampler of
the strings a grammar accepts.

Written from the GBNF description (vendor/llama.cpp/tree/grammars/README.md) and llama.cpp's
parser behaviour; it shares no code with pyllamaopt.grammar.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

MAX_REPETITION_THRESHOLD = 2000  # as llama.cpp


class GBNFSyntaxError(ValueError):
    pass


@dataclass(frozen=True)
class CharSet:
    negated: bool
    ranges: tuple[tuple[int, int], ...]  # empty + negated: any char ('.')

    def matches(self, cp: int) -> bool:
        inside = any(lo <= cp <= hi for lo, hi in self.ranges)
        return inside != self.negated


ANY = CharSet(True, ())


@dataclass(frozen=True)
class Rep:
    """``unit{lo,hi}`` (hi None: unbounded). llama.cpp rewrites it into a chain of rules; the
    language is the same, and counting keeps the recognizer linear on long repetitions."""

    unit: object  # a rule name or a CharSet
    lo: int
    hi: int | None


@dataclass
class Grammar:
    """name -> alternatives, each a tuple of symbols (a rule name, a CharSet or a Rep)."""

    rules: dict[str, list[tuple]] = field(default_factory=dict)
    nullable: set[str] = field(default_factory=set)
    _alts: list = field(default_factory=list)

    def is_nullable(self, sym: object) -> bool:
        if isinstance(sym, str):
            return sym in self.nullable
        if isinstance(sym, Rep):
            return sym.lo == 0 or self.is_nullable(sym.unit)
        return False

    # ---- recognition (Earley, with Aycock-Horspool handling of nullable symbols)
    # items: (alt, dot, origin) for rules; (rep, count, origin) for repetitions

    def matches(self, text: str, root: str = "root", prefix: bool = False) -> bool:
        """Whether `root` matches the whole `text`; with `prefix`, whether some string it matches
        starts with `text`."""
        if not self._alts:
            self._index()
        by_lhs = self._by_lhs
        alts = self._alts
        n = len(text)
        cps = [ord(c) for c in text]
        chart: list[set] = [set() for _ in range(n + 1)]
        waits: list[dict] = []
        for a in by_lhs[root]:
            chart[0].add((a, 0, 0))
        for i in range(n + 1):
            items = list(chart[i])
            seen = chart[i]
            waiting: dict[object, list] = {}

            def add(item):
                if item not in seen:
                    seen.add(item)
                    items.append(item)

            def advance(parent):  # parent's next symbol was just matched
                add(_bump(parent))

            def expect(item, sym):  # item needs sym next, at position i
                if isinstance(sym, CharSet):
                    if i < n and sym.matches(cps[i]):
                        chart[i + 1].add(_bump(item))
                    return
                waiting.setdefault(sym, []).append(item)
                if isinstance(sym, Rep):
                    add((sym, 0, i))
                else:
                    for b in by_lhs[sym]:
                        add((b, 0, i))
                if self.is_nullable(sym):
                    advance(item)

            k = 0
            while k < len(items):
                item = items[k]
                k += 1
                x, d, origin = item
                if isinstance(x, Rep):
                    if x.hi is None or d < x.hi:
                        expect(item, x.unit)
                    if d >= x.lo and origin != i:
                        for parent in waits[origin].get(x, ()):
                            advance(parent)
                    continue
                lhs, rhs = alts[x]
                if d == len(rhs):
                    if origin != i:  # an empty derivation was handled when predicting
                        for parent in waits[origin].get(lhs, ()):
                            advance(parent)
                    continue
                expect(item, rhs[d])
            waits.append(waiting)
            if i < n and not chart[i + 1]:
                return False
        if prefix:  # (every item of chart[n] is there because text[:n] was scanned)
            return True
        return any(not isinstance(a, Rep) and alts[a][0] == root and dot == len(alts[a][1]) and origin == 0
                   for a, dot, origin in chart[n])

    def _index(self) -> None:
        self._alts = []
        self._by_lhs = {}
        for name, alternatives in self.rules.items():
            ids = []
            for rhs in alternatives:
                ids.append(len(self._alts))
                self._alts.append((name, rhs))
            self._by_lhs[name] = ids

    # ---- sampling

    def sample(self, rng: random.Random, root: str = "root", budget: int = 400) -> str:
        """A random string of the grammar's language (biased to short ones once the budget of
        expansions is spent)."""
        if not hasattr(self, "_minlen"):
            self._compute_minlen()
        out: list[str] = []
        stack: list = [root]
        expansions = 0
        while stack:
            sym = stack.pop()
            if isinstance(sym, CharSet):
                out.append(_random_char(sym, rng))
                continue
            expansions += 1
            spent = expansions > budget or len(out) > 4 * budget
            if isinstance(sym, Rep):
                count = sym.lo
                if not spent and self._sym_minlen(sym.unit) < _INF:
                    hi = sym.hi if sym.hi is not None else sym.lo + 4
                    count = rng.choice([sym.lo, sym.lo, rng.randint(sym.lo, hi), hi])
                stack.extend([sym.unit] * count)
                continue
            finite = [alt for alt in self.rules[sym] if self._alt_minlen(alt) < _INF]
            if spent:
                best = min(self._alt_minlen(alt) for alt in finite)
                choice = rng.choice([alt for alt in finite if self._alt_minlen(alt) == best])
            else:
                choice = rng.choice(finite)
            stack.extend(reversed(choice))
        return "".join(out)

    def _sym_minlen(self, s: object) -> float:
        if isinstance(s, CharSet):
            return 1
        if isinstance(s, Rep):
            return s.lo * self._sym_minlen(s.unit) if s.lo else 0
        return self._minlen[s]

    def _alt_minlen(self, alt: tuple) -> float:
        return sum(self._sym_minlen(s) for s in alt)

    def _compute_minlen(self) -> None:
        self._minlen = {name: _INF for name in self.rules}
        changed = True
        while changed:
            changed = False
            for name, alternatives in self.rules.items():
                best = min((self._alt_minlen(a) for a in alternatives), default=_INF)
                if best < self._minlen[name]:
                    self._minlen[name] = best
                    changed = True


def _bump(item: tuple) -> tuple:
    """The item after its next symbol (counts above an unbounded repetition's minimum are all
    alike, so they stop there)."""
    x, d, o = item
    if isinstance(x, Rep) and x.hi is None and d >= x.lo:
        return item
    return (x, d + 1, o)


_INF = float("inf")
_SAMPLE_POOL = [chr(c) for c in range(0x20, 0x7F)] + list("\n\t\r\x00\x1f\x7f\u00e9\u00df\u4e2d\U0001F600\u2028")


def _random_char(cs: CharSet, rng: random.Random) -> str:
    for _ in range(20):
        c = rng.choice(_SAMPLE_POOL)
        if cs.matches(ord(c)):
            return c
    if not cs.negated:
        lo, hi = rng.choice(cs.ranges)
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            cp = lo
        return chr(cp)
    for c in _SAMPLE_POOL:
        if cs.matches(ord(c)):
            return c
    raise ValueError("cannot sample a character")


# --------------------------------------------------------------------------------------
# parsing, after llama.cpp's parser


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.rules: dict[str, list[tuple]] = {}
        self.defined: set[str] = set()
        self.referenced: set[str] = set()
        self.counter = 0
        self.symbols: set[str] = set()  # llama.cpp's symbol_ids: every name seen or generated

    def new_name(self, base: str) -> str:
        self.counter += 1
        name = f"{base}_{self.counter}"
        self.symbols.add(name)
        return name

    def space(self, pos: int, newline_ok: bool) -> int:
        s = self.src
        while pos < len(s) and (s[pos] in " \t#" or (newline_ok and s[pos] in "\r\n")):
            if s[pos] == "#":
                while pos < len(s) and s[pos] not in "\r\n":
                    pos += 1
            else:
                pos += 1
        return pos

    def name(self, pos: int) -> int:
        end = pos
        while end < len(self.src) and _is_word(self.src[end]):
            end += 1
        if end == pos:
            raise GBNFSyntaxError(f"expecting name at {self.src[pos:pos + 20]!r}")
        return end

    def char(self, pos: int) -> tuple[int, int]:
        s = self.src
        if pos >= len(s):
            raise GBNFSyntaxError("unexpected end of input")
        if s[pos] == "\\":
            e = s[pos + 1: pos + 2]
            sizes = {"x": 2, "u": 4, "U": 8}
            if e in sizes:
                digits = s[pos + 2: pos + 2 + sizes[e]]
                if len(digits) != sizes[e] or any(c not in "0123456789abcdefABCDEF" for c in digits):
                    raise GBNFSyntaxError(f"expecting {sizes[e]} hex chars at {s[pos:pos + 10]!r}")
                return int(digits, 16), pos + 2 + sizes[e]
            simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
            if e in simple:
                return simple[e], pos + 2
            raise GBNFSyntaxError(f"unknown escape at {s[pos:pos + 10]!r}")
        return ord(s[pos]), pos + 1

    def parse(self) -> Grammar:
        pos = self.space(0, True)
        while pos < len(self.src):
            pos = self.rule(pos)
        missing = self.referenced - self.defined
        if missing:
            raise GBNFSyntaxError(f"undefined rule identifier {sorted(missing)[0]!r}")
        if "root" not in self.rules:
            raise GBNFSyntaxError("grammar does not contain a 'root' rule")
        g = Grammar(self.rules)
        _compute_nullable(g)
        _check_left_recursion(g)
        return g

    def rule(self, pos: int) -> int:
        end = self.name(pos)
        name = self.src[pos:end]
        self.symbols.add(name)
        pos = self.space(end, False)
        if self.src[pos:pos + 3] != "::=":
            raise GBNFSyntaxError(f"expecting ::= at {self.src[pos:pos + 20]!r}")
        pos = self.space(pos + 3, True)
        pos = self.alternates(pos, name, name, False)
        self.defined.add(name)
        s = self.src
        if pos < len(s):
            if s[pos] == "\r":
                pos += 2 if s[pos + 1: pos + 2] == "\n" else 1
            elif s[pos] == "\n":
                pos += 1
            else:
                raise GBNFSyntaxError(f"expecting newline or end at {s[pos:pos + 20]!r}")
        return self.space(pos, True)

    def alternates(self, pos: int, base: str, rule_name: str, nested: bool) -> int:
        """Parses alternatives into rule ``rule_name``."""
        alts = []
        pos, seq = self.sequence(pos, base, nested)
        alts.append(seq)
        while pos < len(self.src) and self.src[pos] == "|":
            pos = self.space(pos + 1, True)
            pos, seq = self.sequence(pos, base, nested)
            alts.append(seq)
        self.rules.setdefault(rule_name, [])
        if rule_name in self.defined and not nested:
            raise GBNFSyntaxError(f"rule {rule_name!r} defined twice")
        self.rules[rule_name] = alts
        return pos

    def sequence(self, pos: int, base: str, nested: bool) -> tuple[int, tuple]:
        s = self.src
        out: list = []
        last_start = 0
        n_prev = 1
        while pos < len(s):
            c = s[pos]
            if c == '"':
                pos += 1
                last_start = len(out)
                n_prev = 1
                while True:
                    if pos >= len(s):
                        raise GBNFSyntaxError("unexpected end of input")
                    if s[pos] == '"':
                        break
                    cp, pos = self.char(pos)
                    out.append(CharSet(False, ((cp, cp),)))
                pos = self.space(pos + 1, nested)
            elif c == "[":
                pos += 1
                neg = False
                if pos < len(s) and s[pos] == "^":
                    neg, pos = True, pos + 1
                ranges = []
                while True:
                    if pos >= len(s):
                        raise GBNFSyntaxError("unexpected end of input")
                    if s[pos] == "]":
                        break
                    lo, pos = self.char(pos)
                    hi = lo
                    if s[pos: pos + 1] == "-" and s[pos + 1: pos + 2] != "]":
                        if pos + 1 >= len(s):
                            raise GBNFSyntaxError("unexpected end of input")
                        hi, pos = self.char(pos + 1)
                    ranges.append((lo, hi))
                last_start = len(out)
                n_prev = 1
                out.append(CharSet(neg, tuple(ranges)))
                pos = self.space(pos + 1, nested)
            elif c in "<!":
                raise GBNFSyntaxError("token symbols (<...>) are not supported by this checker")
            elif _is_word(c):
                end = self.name(pos)
                ref = s[pos:end]
                self.referenced.add(ref)
                self.symbols.add(ref)
                last_start = len(out)
                n_prev = 1
                out.append(ref)
                pos = self.space(end, nested)
            elif c == "(":
                pos = self.space(pos + 1, True)
                before = len(self.symbols)
                sub = self.new_name(base)
                pos = self.alternates(pos, base, sub, True)
                self.defined.add(sub)
                n_prev = max(1, len(self.symbols) - before)
                last_start = len(out)
                out.append(sub)
                if pos >= len(s) or s[pos] != ")":
                    raise GBNFSyntaxError(f"expecting ')' at {s[pos:pos + 20]!r}")
                pos = self.space(pos + 1, nested)
            elif c == ".":
                last_start = len(out)
                n_prev = 1
                out.append(ANY)
                pos = self.space(pos + 1, nested)
            elif c in "*+?":
                pos = self.space(pos + 1, nested)
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                n_prev = self.repeat(out, last_start, lo, hi, base, n_prev)
            elif c == "{":
                pos = self.space(pos + 1, nested)
                end = pos
                while end < len(s) and s[end].isdigit():
                    end += 1
                if end == pos:
                    raise GBNFSyntaxError(f"expecting an int at {s[pos:pos + 20]!r}")
                lo = int(s[pos:end])
                pos = self.space(end, nested)
                hi: int | None
                if s[pos: pos + 1] == "}":
                    hi = lo
                    pos = self.space(pos + 1, nested)
                elif s[pos: pos + 1] == ",":
                    pos = self.space(pos + 1, nested)
                    hi = None
                    end = pos
                    while end < len(s) and s[end].isdigit():
                        end += 1
                    if end > pos:
                        hi = int(s[pos:end])
                        pos = self.space(end, nested)
                    if s[pos: pos + 1] != "}":
                        raise GBNFSyntaxError(f"expecting '}}' at {s[pos:pos + 20]!r}")
                    pos = self.space(pos + 1, nested)
                else:
                    raise GBNFSyntaxError(f"expecting ',' at {s[pos:pos + 20]!r}")
                if lo > MAX_REPETITION_THRESHOLD:
                    raise GBNFSyntaxError("number of repetitions exceeds sane defaults")
                if hi is not None and hi > MAX_REPETITION_THRESHOLD:
                    hi = None  # llama.cpp: silently unbounded
                n_prev = self.repeat(out, last_start, lo, hi, base, n_prev)
            else:
                break
        return pos, tuple(out)

    def repeat(self, out: list, last_start: int, lo: int, hi: int | None, base: str, n_prev: int) -> int:
        if last_start == len(out):
            raise GBNFSyntaxError("expecting preceding item to */+/?/{")
        prev = out[last_start:]
        total = hi if (hi is not None and hi > 0) else (lo if lo > 0 else 1)
        if n_prev * total > MAX_REPETITION_THRESHOLD:
            raise GBNFSyntaxError("number of rules that are going to be repeated exceeds sane defaults")
        del out[last_start:]
        if len(prev) == 1:
            unit = prev[0]
        else:
            unit = f"{base}_seq{len(self.rules)}"
            self.rules[unit] = [tuple(prev)]
            self.defined.add(unit)
        out.append(Rep(unit, lo, hi))
        for _ in range(1 if hi is None else hi - lo):  # the rules llama.cpp's rewriting creates
            self.new_name(base)
        return n_prev * total


def _compute_nullable(g: Grammar) -> None:
    changed = True
    while changed:
        changed = False
        for name, alts in g.rules.items():
            if name not in g.nullable and any(all(g.is_nullable(s) for s in a) for a in alts):
                g.nullable.add(name)
                changed = True


def _check_left_recursion(g: Grammar) -> None:
    starts: dict[str, set[str]] = {}
    for name, alts in g.rules.items():
        s = set()
        for a in alts:
            for sym in a:
                if isinstance(sym, Rep) and sym.hi is None and g.is_nullable(sym.unit):
                    # llama.cpp's S' ::= S S' | (empty) starts with itself
                    raise GBNFSyntaxError(f"left recursion detected in rule {name!r} (a nullable repetition)")
                first = sym.unit if isinstance(sym, Rep) else sym
                if isinstance(first, str):
                    s.add(first)
                if not g.is_nullable(sym):
                    break
        starts[name] = s
    for name in g.rules:
        todo, seen = list(starts[name]), set()
        while todo:
            m = todo.pop()
            if m == name:
                raise GBNFSyntaxError(f"left recursion detected for rule {name!r}")
            if m not in seen:
                seen.add(m)
                todo += starts[m]


def parse_gbnf(src: str) -> Grammar:
    """Parses a GBNF grammar (raises GBNFSyntaxError where llama.cpp would refuse it)."""
    return _Parser(src).parse()
