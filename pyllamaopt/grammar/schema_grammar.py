"""The entry point: compile_json_schema (a schema to its grammar, SchemaGrammar) and
json_schema_to_gbnf."""
from __future__ import annotations

from typing import Any, Union

from ..errors import GrammarError
from .base import WHITESPACE, Relaxation
from .converter import Converter
from .refs import local_refs
from .schema import Unsatisfiable, check_json
from .validation import SchemaCheck, check_text, validator


class SchemaGrammar:
    """A JSON Schema compiled to a grammar (``compile_json_schema``): ``gbnf`` the grammar,
    ``relaxed`` the constraints it does not enforce (strict=False; empty when ``exact``), and
    ``check(text)``, the finished output checked against the whole schema."""

    def __init__(self, schema: Any, gbnf: str, strict: bool, relaxed: tuple[Relaxation, ...]) -> None:
        self.schema = schema
        self.gbnf = gbnf
        self.strict = strict
        self.relaxed = relaxed
        self._validator: Any = None

    @property
    def exact(self) -> bool:
        """Whether the grammar enforces the whole schema (every output it allows is valid)."""
        return not self.relaxed

    def check(self, text: str) -> SchemaCheck:
        """Whether ``text`` is an instance of the schema (jsonschema; see validation.py)."""
        if self._validator is None:
            try:
                self._validator = validator(self.schema)
            except Exception as e:  # noqa: BLE001 - a schema jsonschema cannot load
                return SchemaCheck(None, f"the schema could not be loaded by jsonschema: {type(e).__name__}: {e}")
        return check_text(self._validator, text)

    def __repr__(self) -> str:
        return f"SchemaGrammar({len(self.gbnf)} characters of GBNF, strict={self.strict}, relaxed={len(self.relaxed)})"


def compile_json_schema(schema: Union[dict, bool], *, whitespace: str = "spaced", strict: bool = True) -> SchemaGrammar:
    """The grammar of the canonical JSON texts of the instances of ``schema``, and what it does
    not enforce.

    whitespace  "spaced" (default): one space after each ``,`` and ``:``, none elsewhere
                (``{"a": 1, "b": [1, 2]}``, json.dumps's spelling: small models write valid
                documents more often in it than compactly, docs/structured-output.md);
                "compact": no whitespace at all (``{"a":1,"b":[1,2]}``); both force every
                whitespace token. "free": up to 24 whitespace characters (space, tab, newline,
                CR) around each ``{ } [ ] : ,`` (never before or after the whole value), so
                pretty-printed output (``json.dumps(x, indent=2)``) is accepted too.
    strict   True: a constraint a grammar cannot enforce (``uniqueItems: true``, an overlapping
             ``oneOf``, ``not``, a lookahead in a pattern...) raises UnenforceableSchemaError.
             False: the grammar enforces everything else (exactly) and ``relaxed`` lists what it
             left out; check the output with ``check`` (Session.generate does:
             ``Generation.schema_valid``).

    Raises GrammarError for an invalid or unsatisfiable schema, and UnenforceableSchemaError
    (with strict) as above; docs/structured-output.md lists what is enforced.
    """
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"a JSON Schema must be a dict or a bool, got {type(schema).__name__}")
    if whitespace not in WHITESPACE:
        raise ValueError(f"whitespace must be one of {', '.join(WHITESPACE)}, got {whitespace!r}")
    original = schema
    try:
        check_json(schema)
        schema = local_refs(schema)
        conv = Converter(schema, whitespace, bool(strict))
        name = conv.alloc("root")
        conv.ref_rules["#"] = name
        conv.define("root", conv.gen(schema, "root", "#"), "root")
        gbnf = conv.finish()
    except Unsatisfiable as e:
        raise GrammarError(f"the JSON Schema admits no value: {e}. Fix the schema (a required property "
                           "or type that cannot be satisfied)") from None
    except RecursionError:
        raise GrammarError("the JSON Schema is nested too deeply to convert") from None
    return SchemaGrammar(original, gbnf, bool(strict), tuple(conv.relaxed.values()))


def json_schema_to_gbnf(schema: Union[dict, bool], *, whitespace: str = "spaced", strict: bool = True) -> str:
    """The GBNF grammar (llama.cpp's format, rule ``root``) of the canonical JSON texts of the
    instances of ``schema``: ``compile_json_schema(...).gbnf`` (see there)."""
    return compile_json_schema(schema, whitespace=whitespace, strict=strict).gbnf


#: any JSON value, canonical (spaced) form (what ``json_schema=True`` uses)
JSON_GBNF: str = json_schema_to_gbnf(True)
