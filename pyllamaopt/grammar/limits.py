"""Limits a GBNF text is checked against before llama.cpp parses it: its parser and our grammar
analysis recurse into nested groups and chains of rules, so a grammar of 20,000 nested parentheses
(40 KB) or 100,000 chained rules overflowed the stack and killed the process, a server with it
(one request's grammar). Far above anything a schema or a hand-written grammar needs."""
from __future__ import annotations

import re

from ..errors import GrammarError

MAX_NESTING = 1000  # groups within groups
MAX_RULES = 10000

# literals and character classes (with backslash escapes) and comments: what does not nest
_NOT_STRUCTURE = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*')
_PARENS = re.compile(r"[()]")
_REPETITION = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")


def check_gbnf_limits(gbnf: str) -> None:
    """GrammarError if `gbnf` nests groups deeper than MAX_NESTING or has more than MAX_RULES rules,
    has a repetition {min,max} with min > max (llama.cpp's parser then allocates without end), or is
    not text a parser can take (a lone surrogate); counted outside literals, character classes and
    comments."""
    try:
        gbnf.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise GrammarError(f"the grammar is not valid UTF-8 text ({exc.reason} at character {exc.start})") from None
    structure = _NOT_STRUCTURE.sub("", gbnf)
    depth = deepest = 0
    for paren in _PARENS.finditer(structure):
        depth += 1 if paren.group() == "(" else -1
        deepest = max(deepest, depth)
    rules = structure.count("::=")
    if deepest > MAX_NESTING:
        raise GrammarError(f"the grammar nests groups {deepest} deep (at most {MAX_NESTING}): define the inner parts "
                           "as rules of their own")
    if rules > MAX_RULES:
        raise GrammarError(f"the grammar has {rules} rules (at most {MAX_RULES})")
    for bounds in _REPETITION.finditer(structure):  # llama.cpp's parser counts max - min down from 2^64 - 1
        if int(bounds[1]) > int(bounds[2]):
            raise GrammarError(f"the repetition {bounds[0]} has its minimum above its maximum: write {{min,max}} "
                               "with min <= max")
