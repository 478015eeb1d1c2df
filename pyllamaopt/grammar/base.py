"""What the rules of every JSON type share (the converter's base): the schema being converted,
what is done with a constraint a grammar cannot enforce, and how the grammar spaces JSON."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UnenforceableSchemaError
from .gbnf import EMPTY, Node, alt, literal, optional, repeat, seq
from .rules import Rules
from .validation import validator

#: whitespace="free": at most this many whitespace characters between two tokens
MAX_WS = 24
#: whitespace="indented": at most this many spaces or tabs of indentation after a line break
#: (llama.cpp's converter's limit)
MAX_INDENT = 20
#: how the grammar spaces JSON: "spaced" (the default) ``{"a": 1, "b": [1, 2]}``, as json.dumps
#: writes it and as models have mostly seen it; "compact" ``{"a":1,"b":[1,2]}``; "free" any
#: whitespace (up to MAX_WS characters) around each ``{ } [ ] : ,``; "indented" the layouts models
#: write: one line (spaced or compact) or a line break and indentation after ``{ [ ,`` and before
#: ``} ]`` (``json.dumps(x, indent=2)``), nothing before ``:`` and ``,``
WHITESPACE = ("spaced", "compact", "free", "indented")


@dataclass(frozen=True)
class Relaxation:
    """A constraint of the schema that the grammar does not enforce (strict=False): where it
    is (a JSON pointer), its keyword, and why."""

    path: str
    keyword: str
    reason: str


class ConverterBase(Rules):
    """The state of one schema's conversion. The rules of each JSON type (strings.py,
    numbers.py, objects.py, arrays.py) build on it; ``gen`` (converter.py) gives the rule of
    a subschema, for the values they contain."""

    def __init__(self, root: Any, whitespace: str, strict: bool = True) -> None:
        super().__init__()
        self.root = root
        self.whitespace = whitespace
        self.strict = strict
        self.relaxed: dict[tuple[str, str], Relaxation] = {}
        self.validator: Any = None

    def gen(self, schema: Any, hint: str, path: str) -> Node:
        """The rule of a subschema (Converter.gen)."""
        raise NotImplementedError

    def matches(self, value: Any, schema: Any) -> bool:
        """Whether a value is valid against a subschema (jsonschema, references resolved in root)."""
        if self.validator is None:
            self.validator = validator(self.root)
        return bool(self.validator.evolve(schema=schema).is_valid(value))

    def relax(self, err: UnenforceableSchemaError) -> None:
        """strict: refuse the constraint; else leave it to the check of the finished output."""
        if self.strict:
            raise err
        key = (err.path or "#", err.keyword or "?")
        if key not in self.relaxed:
            self.relaxed[key] = Relaxation(key[0], key[1], str(err))

    # ---- whitespace and punctuation

    def ws(self) -> Node:
        return self.shared_rule("ws", lambda: repeat(("cls", "[ \\t\\n\\r]"), 0, MAX_WS))

    def line_break(self) -> Node:
        """whitespace="indented": nothing, one space, or one or two newlines and an indentation
        (llama.cpp's converter's ``space`` rule)."""
        return self.shared_rule("ws", lambda: alt(EMPTY, literal(" "), seq(
            repeat(literal("\n"), 1, 2), repeat(("cls", "[ \\t]"), 0, MAX_INDENT))))

    def gap(self) -> Node:
        """The whitespace inside brackets and around commas (free) or after them (indented)."""
        return self.ws() if self.whitespace == "free" else self.line_break()

    def punct(self, c: str) -> Node:
        """A comma or colon: one space after it when spaced, whitespace around it when free; when
        indented, a line break or space after a comma, at most a space after a colon."""
        if self.whitespace == "free":
            return seq(self.ws(), literal(c), self.ws())
        if self.whitespace == "indented":
            return seq(literal(c), self.line_break() if c == "," else optional(literal(" ")))
        return literal(c + " " if self.whitespace == "spaced" else c)

    def bracket(self, open_: str, content: Node, nullable: bool, close: str) -> Node:
        """``open_ content close``; content may be empty if ``nullable``. Free or indented: one
        stretch of whitespace where the content would be, else around it; none otherwise."""
        if self.whitespace not in ("free", "indented"):
            return seq(literal(open_), optional(content) if nullable else content, literal(close))
        ws = self.gap()
        if content == EMPTY:
            return seq(literal(open_), ws, literal(close))
        body = seq(content, ws)
        return seq(literal(open_), ws, optional(body) if nullable else body, literal(close))

    def comma(self) -> Node:
        return self.punct(",")

    def colon(self) -> Node:
        return self.punct(":")
