"""JSON Schema → GBNF (llama.cpp's grammar format), in pure Python.

    >>> from pyllamaopt.grammar import json_schema_to_gbnf
    >>> print(json_schema_to_gbnf({"type": "object", "properties": {"ok": {"type": "boolean"}},
    ...                            "required": ["ok"]}), end="")
    root ::= "{\\"ok\\": " boolean "}"
    boolean ::= "true" | "false"

The grammar accepts one *canonical* spelling of each instance (JSON as json.dumps writes
it, one space after each comma and colon; properties in schema order; no free whitespace), so
that as many tokens as possible are forced by the grammar — the engine takes forced tokens
without computing logits. Every string the grammar accepts is valid against the schema; a
schema (or keyword) the converter cannot express exactly raises
:class:`~pyllamaopt.errors.GrammarError` instead of being loosened.
The supported keywords and the canonical form: docs/structured-output.md.
"""
from __future__ import annotations

from .base import MAX_INDENT, MAX_WS, WHITESPACE, Relaxation
from .numbers import MAX_EXP_DIGITS, MAX_FRAC_DIGITS, MAX_INT_DIGITS  # the canonical form's limits
from .schema_grammar import JSON_GBNF, SchemaGrammar, compile_json_schema, json_schema_to_gbnf
from .strings import SUPPORTED_FORMATS
from .validation import SchemaCheck

__all__ = ["JSON_GBNF", "json_schema_to_gbnf", "compile_json_schema", "SchemaGrammar", "SchemaCheck", "Relaxation",
           "SUPPORTED_FORMATS", "WHITESPACE", "MAX_INDENT"]
