"""The check of a finished output against the whole schema, with jsonschema (for what the
grammar does not enforce with strict=False, and as a second opinion on what it does).

Three readings differ from jsonschema's defaults, all toward JSON Schema's text: ``multipleOf``
is decided on the decimal value (jsonschema divides floats: 0.07 would not be a multiple of
0.01), formats are checked (jsonschema's FormatChecker; a format whose checker needs a
package that is not installed, e.g. rfc3987 for "uri", passes), and a boolean
``exclusiveMinimum``/``exclusiveMaximum`` is draft 4's in any dialect, as the grammar reads it
(jsonschema's 2020-12 keyword compares the instance with False or True as with 0 or 1).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterator

import jsonschema
from jsonschema import Draft4Validator, Draft202012Validator
from jsonschema.exceptions import ValidationError


@dataclass(frozen=True)
class SchemaCheck:
    """valid: True or False; None if the check could not run (error says why)."""

    valid: bool | None
    error: str | None = None


def _multiple_of(validator: Any, m: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "number") or not validator.is_type(m, "number") or m <= 0:
        return
    try:
        q = Fraction(repr(instance)) / Fraction(repr(m))
    except (ValueError, OverflowError):  # inf or nan
        yield ValidationError(f"{instance!r} is not a multiple of {m!r}")
        return
    if q.denominator != 1:
        yield ValidationError(f"{instance!r} is not a multiple of {m!r}")


def _draft4_exclusive(bound: str, number_check: Any) -> Any:
    """exclusiveMinimum/exclusiveMaximum: a number as the dialect says, a boolean as draft 4 does
    (true: the instance differs from ``bound``, which the dialect's own keyword already checks)."""
    def check(validator: Any, exclusive: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if not isinstance(exclusive, bool):
            yield from number_check(validator, exclusive, instance, schema)
        elif exclusive and validator.is_type(instance, "number") and instance == schema.get(bound):
            yield ValidationError(f"{instance!r} equals the exclusive {bound} {schema[bound]!r}")
    return check


def validator(schema: Any) -> Any:
    """A jsonschema validator of the schema's dialect ($schema; draft 4 for schemas that name
    themselves with 'id'; else 2020-12), with formats checked and decimal multipleOf."""
    if isinstance(schema, dict) and "$schema" not in schema and isinstance(schema.get("id"), str) \
            and "$id" not in schema:
        base = Draft4Validator
    else:
        base = jsonschema.validators.validator_for(schema, default=Draft202012Validator)
    keywords = {"multipleOf": _multiple_of}
    for keyword, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if keyword in base.VALIDATORS:  # draft 4 reads the booleans inside minimum/maximum itself
            keywords[keyword] = _draft4_exclusive(bound, base.VALIDATORS[keyword])
    cls = jsonschema.validators.extend(base, keywords)
    return cls(schema, format_checker=base.FORMAT_CHECKER)


def check_text(checker: Any, text: str) -> SchemaCheck:
    """Whether ``text`` is one JSON value valid against the validator's schema."""
    try:
        value = json.loads(text)
    except ValueError as e:
        return SchemaCheck(False, f"the output is not one JSON value: {e}")
    try:
        error = jsonschema.exceptions.best_match(checker.iter_errors(value))
    except Exception as e:  # noqa: BLE001 - an unresolvable $ref, a pattern Python's re refuses, ...
        return SchemaCheck(None, f"the output could not be checked against the schema: {type(e).__name__}: {e}")
    if error is None:
        return SchemaCheck(True)
    return SchemaCheck(False, f"{error.json_path}: {error.message}")
