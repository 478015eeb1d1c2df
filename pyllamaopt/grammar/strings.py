"""The rules of a string schema: the JSON string and its characters; minLength/maxLength,
pattern and format (a regular expression: regex_rules.py)."""
from __future__ import annotations

from typing import Any

from ..errors import UnsupportedRegexError
from .base import ConverterBase
from .formats import ALIASES, FORMATS, format_pattern
from .formats import UNENFORCEABLE as UNENFORCEABLE_FORMATS
from .gbnf import Node, alt, literal, repeat, seq
from .regex import Regex, parse_regex
from .regex_rules import regex_node
from .schema import Unsatisfiable, as_count, unenforceable

#: string formats with a grammar (a canonical subset of their strings: formats.py)
SUPPORTED_FORMATS = tuple(sorted({*FORMATS, *ALIASES}))
_HEX = "[0-9a-fA-F]"


class StringRules(ConverterBase):
    """A string schema's rule (gen_string); the JSON string any key or value may be (string)."""

    def __init__(self, root: Any, whitespace: str, strict: bool = True) -> None:
        super().__init__(root, whitespace, strict)
        self.regex_nodes: dict[tuple, Node | None] = {}

    def char(self) -> Node:
        def build() -> Node:
            # \uXXXX of one code point: not a surrogate, or a high and a low surrogate together
            hex2 = repeat(("cls", _HEX), 2, 2)
            hex4 = alt(seq(("cls", "[0-9a-ce-fA-CE-F]"), repeat(("cls", _HEX), 3, 3)),
                       seq(("cls", "[dD]"), ("cls", "[0-7]"), hex2),
                       seq(("cls", "[dD]"), ("cls", "[89abAB]"), hex2, literal("\\u"), ("cls", "[dD]"),
                           ("cls", "[c-fC-F]"), hex2))
            return alt(("cls", '[^"\\\\\\x00-\\x1F]'),
                       seq(literal("\\"), alt(("cls", '["\\\\/bfnrt]'), seq(literal("u"), hex4))))
        return self.shared_rule("char", build)

    def string(self) -> Node:
        return self.shared_rule("string", lambda: seq(literal('"'), repeat(self.char(), 0, None), literal('"')))

    def gen_string(self, schema: dict, hint: str, path: str) -> Node:
        lo = as_count(schema.get("minLength", 0), path, "minLength")
        hi = schema.get("maxLength")
        hi = None if hi is None else as_count(hi, path, "maxLength")
        if hi is not None and hi < lo:
            raise Unsatisfiable(path, f"maxLength {hi} < minLength {lo}")
        fmt = schema.get("format")
        fmt_pattern = format_pattern(fmt)  # None: a format that only annotates
        if fmt in UNENFORCEABLE_FORMATS:
            self.relax(unenforceable(path, "format", f"format {fmt!r} is not produced by a grammar (drop it and "
                                     "check the value after generation)"))
        if "pattern" in schema and fmt_pattern is not None:
            self.relax(unenforceable(path, "format", f"'pattern' and format {fmt!r} together cannot be "
                                     "expressed (the strings matching both): keep one of them"))
            fmt_pattern = None  # relaxed: the pattern is enforced
        regex: Regex | None = None
        keyword = "pattern" if "pattern" in schema else "format"
        source = schema["pattern"] if "pattern" in schema else fmt_pattern
        if source is not None:
            try:
                regex = self.regex(source, path, keyword)
            except UnsupportedRegexError as e:  # relaxed: a string without the pattern
                self.relax(e)
        if regex is None:
            if lo == 0 and hi is None:
                return self.string()
            return self.define(hint, seq(literal('"'), self.rep(self.char(), lo, hi, "char"), literal('"')))
        what = f"'pattern' {source!r}" if keyword == "pattern" else f"format {fmt!r}"
        if not regex.admits_length(lo, hi):
            raise Unsatisfiable(path, f"{what} matches no string of {lo} to {hi} characters")
        name = hint if keyword == "pattern" else ALIASES.get(str(fmt), str(fmt))
        node = self.regex_rules(regex, lo, hi, name)
        if node is None:
            self.relax(unenforceable(
                path, keyword, f"{what} cannot be combined with minLength/maxLength ({lo}..{hi}): the converter fits "
                "lengths only by changing the counts of repetitions; write the length into the pattern "
                "('[a-z]{1,8}') instead"))
            node = self.regex_rules(regex, 0, None, name)  # relaxed: the lengths are not enforced
        if node is None:
            raise Unsatisfiable(path, f"{what} matches no string")
        return self.define(name, node)

    def regex_rules(self, regex: Regex, lo: int, hi: int | None, name: str) -> Node | None:
        key = (regex.source, lo, hi, name)
        if key not in self.regex_nodes:  # the same pattern or format again: the same rules
            self.regex_nodes[key] = regex_node(regex, lo, hi, self.rep, self.define, name)
        return self.regex_nodes[key]

    def regex(self, pattern: Any, path: str, keyword: str) -> Regex:
        try:
            return parse_regex(pattern)
        except UnsupportedRegexError as e:
            raise UnsupportedRegexError(f"JSON Schema at {path}: {e}", e.construct, keyword, path) from None
