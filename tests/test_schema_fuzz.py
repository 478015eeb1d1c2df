"""Fuzzing the JSON Schema → GBNF converter (issue 20, spec 000 §6.4) with random schemas:
every schema gives a grammar that llama.cpp's parser accepts (tests/gbnf_check.py follows it)
and whose strings are valid instances, or a typed error (GrammarError and its subclasses); never
another exception.

The schemas are drawn from every keyword the converter knows and many it does not, with values
of the right type most of the time and of any type otherwise (a schema comes from a user or a
client's request). In CI hypothesis draws its default number of examples; tools/fuzz.sh runs
them at volume (``--hypothesis-profile=fuzz``)."""
from __future__ import annotations

import math

import pytest

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gbnf_check import parse_gbnf
from pyllamaopt.errors import GrammarError
from pyllamaopt.grammar import SUPPORTED_FORMATS, WHITESPACE, compile_json_schema

NAMES = ["a", "b", "id", "name", "x-y", "", "é", 'q"uote', "back\\slash", "$ref", "0"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([10**400, -10**400, 2**63, 1e308, 5e-324]) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(NAMES), inner, max_size=3),
    max_leaves=5)
# anything a Python caller might pass: also non-finite floats, tuples, sets and objects
odd_values = json_values | st.sampled_from([math.nan, math.inf, -math.inf, (1, 2), {1, 2}, b"x", object()])

TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]
PATTERNS = ["^a+$", "[0-9]{2,4}", "^(ab|cd)*$", "\\d+\\.\\d*", "^[^x]$", "(?=a)a", "a{3}", "^$", "[", "a**", "\\p{L}",
            "^\\w+@\\w+\\.com$", ".*", "(a|b){0,1000}", "x{2000,}"]
REFS = ["#", "#/$defs/a", "#/$defs/b", "#/definitions/a", "#/properties/a", "#/$defs/missing", "#/$defs/a/items",
        "other.json#/x", "#a", "#/", ""]


def counts() -> st.SearchStrategy:
    return st.integers(-1, 12) | st.sampled_from([0, 1, 2**31, 10**9, 1.5, -0.0, 2.0])


def numbers() -> st.SearchStrategy:
    return st.integers(-10**6, 10**6) | st.floats(-1e6, 1e6) | st.sampled_from([0, 0.1, 1e-9, 1e300, 10**30, -5])


def keyword_values(schemas: st.SearchStrategy) -> dict[str, st.SearchStrategy]:
    names = st.sampled_from(NAMES)
    schema_map = st.dictionaries(names, schemas, max_size=3)
    schema_list = st.lists(schemas, max_size=3)
    return {
        "type": st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), max_size=3),
        "properties": schema_map,
        "required": st.lists(names, max_size=3),
        "additionalProperties": schemas,
        "patternProperties": st.dictionaries(st.sampled_from(PATTERNS), schemas, max_size=2),
        "propertyNames": schemas,
        "minProperties": counts(), "maxProperties": counts(),
        "dependentRequired": st.dictionaries(names, st.lists(names, max_size=2), max_size=2),
        "dependentSchemas": schema_map,
        "dependencies": st.dictionaries(names, st.lists(names, max_size=2) | schemas, max_size=2),
        "items": schemas | schema_list,
        "prefixItems": schema_list,
        "additionalItems": schemas,
        "contains": schemas, "minContains": counts(), "maxContains": counts(),
        "minItems": counts(), "maxItems": counts(), "uniqueItems": st.booleans(),
        "enum": st.lists(json_values, max_size=4),
        "const": json_values,
        "anyOf": schema_list, "oneOf": schema_list, "allOf": schema_list,
        "not": schemas,
        "if": schemas, "then": schemas, "else": schemas,
        "$ref": st.sampled_from(REFS),
        "$defs": st.dictionaries(st.sampled_from(["a", "b"]), schemas, max_size=2),
        "definitions": st.dictionaries(st.sampled_from(["a", "b"]), schemas, max_size=2),
        "minimum": numbers(), "maximum": numbers(), "exclusiveMinimum": numbers() | st.booleans(),
        "exclusiveMaximum": numbers() | st.booleans(), "multipleOf": numbers(),
        "minLength": counts(), "maxLength": counts(),
        "pattern": st.sampled_from(PATTERNS) | st.text(max_size=8),
        "format": st.sampled_from([*SUPPORTED_FORMATS, "unknown-format"]),
        "title": st.text(max_size=5), "description": st.text(max_size=5), "default": json_values,
        "examples": st.lists(json_values, max_size=2), "nullable": st.booleans(),
        "unevaluatedProperties": schemas, "unevaluatedItems": schemas,
        "$schema": st.sampled_from(["https://json-schema.org/draft/2020-12/schema", "x"]),
        "$id": st.sampled_from(["http://example.com/s", "#a"]), "$anchor": st.just("a"),
        "contentEncoding": st.just("base64"), "x-custom": json_values,
    }


def schema_objects(schemas: st.SearchStrategy) -> st.SearchStrategy:
    values = keyword_values(schemas)

    @st.composite
    def one(draw):
        keys = draw(st.lists(st.sampled_from(sorted(values)), max_size=5, unique=True))
        # mostly values of the keyword's type, sometimes anything at all
        return {k: draw(odd_values if draw(st.integers(0, 9)) == 0 else values[k]) for k in keys}

    return one()


random_schemas = st.recursive(st.booleans() | st.just({}) | st.builds(lambda t: {"type": t}, st.sampled_from(TYPES)),
                              schema_objects, max_leaves=12)


@given(random_schemas | odd_values, st.booleans(), st.sampled_from(WHITESPACE), st.randoms(use_true_random=False))
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_random_schemas_give_a_grammar_or_a_typed_error(schema, strict, whitespace, rng):
    """And what the grammar produces is valid (strict: against the whole schema; else the
    Generation's check says so), judged by jsonschema's Draft 2020-12 validator."""
    try:
        grammar = compile_json_schema(schema, strict=strict, whitespace=whitespace)
    except GrammarError as e:
        event(type(e).__name__)  # (tools/fuzz.sh shows the shares: --hypothesis-show-statistics)
        return
    event("grammar")
    parsed = parse_gbnf(grammar.gbnf)  # llama.cpp's syntax and limits (repetitions, left recursion)
    for _ in range(3):
        check = grammar.check(parsed.sample(rng, budget=200))
        assert check.valid is not False or not strict, check.error  # (None: jsonschema could not run it)


def _contains_itself() -> dict:
    schema: dict = {"type": "object", "properties": {}}
    schema["properties"]["a"] = schema
    return schema


# what the fuzzing found (a TypeError, ValueError or OverflowError escaped for minItems NaN, pattern [],
# minimum 10**400, dependencies [[]], a tuple in enum, a non-string key, a dict inside itself) and neighbours
@pytest.mark.parametrize("schema", [
    {"minItems": math.nan}, {"maximum": math.inf}, {"pattern": []}, {"$ref": 5}, {"minimum": 10**400},
    {"dependencies": {"a": [[]]}}, {"dependentRequired": {"a": "b"}}, {"dependentSchemas": {"a": 3}},
    {"enum": [(1, 2)]}, {"const": {1: 2}}, {"not": []}, {"prefixItems": {}}, _contains_itself(),
], ids=repr)
def test_what_fuzzing_found_is_a_grammar_error(schema):
    with pytest.raises(GrammarError):
        compile_json_schema(schema)


def test_a_sub_schema_used_twice_and_huge_integers_are_fine():
    shared = {"type": "integer", "maximum": 10**400}
    grammar = compile_json_schema({"type": "object", "properties": {"a": shared, "b": shared},
                                   "required": ["a", "b"]})
    assert grammar.check('{"a":1,"b":2}').valid
    assert compile_json_schema({"const": 10**400}).check(str(10**400)).valid


@pytest.mark.parametrize("schema, accepted, refused", [
    ({"exclusiveMaximum": False, "type": "integer"}, ["0", "1", "-1"], []),
    ({"maximum": 3, "exclusiveMaximum": True, "type": "integer"}, ["2"], ["3", "4"]),
    ({"minimum": 3, "exclusiveMinimum": True, "type": "integer"}, ["4"], ["3", "2"]),
    ({"exclusiveMaximum": 2, "type": "integer"}, ["1"], ["2"]),
], ids=repr)
def test_a_boolean_exclusive_bound_means_draft_4s_to_the_grammar_and_to_the_check(schema, accepted, refused):
    """The fuzzing found {"exclusiveMaximum": false}: the grammar read draft 4's boolean (no bound)
    while jsonschema's 2020-12 keyword compared the instance with False as with 0."""
    grammar = compile_json_schema(schema)
    parsed = parse_gbnf(grammar.gbnf)
    for text in accepted:
        assert parsed.matches(text) and grammar.check(text).valid, text
    for text in refused:
        assert not parsed.matches(text) and grammar.check(text).valid is False, text
