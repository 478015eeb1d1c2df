"""whitespace="indented", the layout of the server's JSON answers (--json-whitespace): the layouts
models write are accepted (json.dumps's one line, compact, indented by spaces or a tab, the
braces' own line), the ones they do not are refused (whitespace before a colon or comma, around
the document, a line break after a colon, indentation past MAX_INDENT); what the grammar produces
is valid (also by test_grammar.py's and test_schema_fuzz.py's tests over every WHITESPACE)."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyllamaopt.grammar import MAX_INDENT, json_schema_to_gbnf
from test_grammar import BY_NAME, NAMES, _any_json, accepts, instance, valid

USER = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                         "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age"]}


def layouts(value) -> list[str]:
    """The texts of a value as models write it (an indentation deeper than the grammar's left out)."""
    texts = [json.dumps(value, ensure_ascii=False), json.dumps(value, separators=(",", ":"), ensure_ascii=False)]
    for indent in (2, 4, "\t"):
        text = json.dumps(value, indent=indent, ensure_ascii=False)
        if max(len(line) - len(line.lstrip(" \t")) for line in text.splitlines()) <= MAX_INDENT:
            texts.append(text)
    return texts


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_the_layouts_models_write_are_accepted(name, data):
    schema = BY_NAME[name]
    value = instance(data.draw, schema, schema)
    assert valid(value, schema, schema), value
    for text in layouts(value):
        assert accepts(schema, text, "indented"), text


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_any_json)
def test_any_json_value_in_any_layout(value):
    for text in layouts(value):
        assert accepts(True, text, "indented"), text


def test_whitespace_models_do_not_write_is_refused():
    value = {"name": "Jason", "age": 25, "tags": ["a", "b"]}
    assert accepts(USER, '{\n  "name": "Jason",\n  "age": 25,\n\n  "tags": [ "a", "b" ]\n}', "indented")
    assert accepts(USER, '{ "name":"Jason", "age":25 }', "indented")
    for text in ('{"name" : "Jason", "age": 25}', '{"name": "Jason" , "age": 25}', '{"name":\n"Jason", "age": 25}',
                 '{"name":  "Jason", "age": 25}', '{"name":\t"Jason", "age": 25}', ' {"name": "Jason", "age": 25}',
                 '{"name": "Jason", "age": 25}\n', '{\n\n\n  "name": "Jason", "age": 25}', '{\r\n"name": "J", "age": 2}',
                 '{\n' + " " * (MAX_INDENT + 1) + '"name": "Jason", "age": 25}', json.dumps(value, indent=21)):
        assert not accepts(USER, text, "indented"), text


def test_a_const_is_written_as_json_dumps_writes_it():
    schema = {"type": "object", "properties": {"c": {"const": {"x": [1, 2]}}}, "required": ["c"]}
    assert accepts(schema, '{\n  "c": {"x": [1, 2]}\n}', "indented")
    assert not accepts(schema, '{"c": {"x":[1,2]}}', "indented")


def test_the_line_break_rule_is_llama_cpps():
    """llama.cpp's converter's ``space`` rule, after the commas and inside the brackets only."""
    gbnf = json_schema_to_gbnf(USER, whitespace="indented")
    assert '"\\n"{1,2} [ \\t]{0,20}' in gbnf and MAX_INDENT == 20
    assert gbnf.startswith('root ::= "{" ws "\\"name\\":" " "? string "," ws "\\"age\\":" " "? integer')
