"""JSON Schema regular expressions (``pattern``, ``patternProperties``) as grammar rules
(pyllamaopt/grammar/regex.py), checked without a model against Python's ``re`` (what jsonschema
uses) and jsonschema itself:

* soundness: every string the grammar produces matches the pattern under Python's ``re`` (and
  under ECMA-262's reading, our Python translation), with the length bounds;
* completeness: strings drawn from the pattern (hypothesis) that match under both readings are
  accepted; random strings are accepted exactly when they match;
* what cannot be translated raises UnsupportedRegexError naming the construct.
"""
from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gbnf_check import parse_gbnf
from pyllamaopt.errors import GrammarError, UnenforceableSchemaError, UnsupportedRegexError
from pyllamaopt.grammar import json_schema_to_gbnf
from pyllamaopt.grammar.regex import parse_regex

# patterns as JSONSchemaBench has them (and edge cases); each is valid in Python's re as well
PATTERNS = [
    r"^[a-z0-9-]+$", r"^\d{3}-\d{4}$", "abc", r"^(?:[A-Z]{2}|\d+)\.x$", r"^\S+@\S+\.\S+$", r'[^"\\]', r"^.*$",
    r"^\w+$", r"^[A-Za-z_][A-Za-z0-9_]*$", r"^(\([0-9]{3}\))?[0-9]{3}-[0-9]{4}$", r"^#([0-9a-fA-F]{3}){1,2}$",
    r"x|^y$|z$", r"^$", r"^\s*$", "^[^\\n]+$", r"^(https?|ftp)://[^\s/$.?#].[^\s]*$", r"^a{2,}b?c*?$", r"[.]",
    r"^[\]\-^]$", r"^\/path\/\d+$", r"^[^\d\s]{1,3}$", r"\D\W", r"^\x41\t\u00e9$", r"^(a|b)*c{0,2}$",
    r"^([a-z0-9-]+):([a-z0-9\.-]+):([a-z0-9-]+)?:([a-z0-9-]+)$", r"^(?:\S+\s+){0,9}\S+$", r"^v\d+(\.\d+){2}$",
    r"^[\w.+-]+@[\w-]+\.[\w.-]+$", r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$", r"^[^<>]*$", r'^"?\\$',
    r"^(a?){5}b$", r"^((ab)?){3}$", r"^((a?){2}){3}c$", r"^(x{0,2})*y$",  # repetitions of what may be empty
]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
_grammars: dict = {}


def grammar(schema):
    key = json.dumps(schema, sort_keys=True)
    if key not in _grammars:
        _grammars[key] = parse_gbnf(json_schema_to_gbnf(schema, whitespace="compact"))  # as the texts below
    return _grammars[key]


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def ecma_match(pattern: str, s: str) -> bool:
    return re.search(parse_regex(pattern).python(), s) is not None


@pytest.mark.parametrize("pattern", PATTERNS)
def test_what_the_grammar_produces_matches(pattern):
    for bounds in ({}, {"minLength": 3, "maxLength": 12}, {"maxLength": 5}):
        schema = {"type": "string", "pattern": pattern, **bounds}
        try:
            g = grammar(schema)
        except GrammarError:
            assert bounds, pattern  # only a length bound may be impossible to fit
            continue
        rnd = random.Random(pattern)
        for _ in range(30):
            text = g.sample(rnd, budget=rnd.choice([10, 40, 120]))
            value = json.loads(text)
            assert text == dumps(value), text  # one canonical spelling
            assert re.search(pattern, value), (pattern, value)  # Python's reading (jsonschema's)
            assert ecma_match(pattern, value), (pattern, value)
            assert bounds.get("minLength", 0) <= len(value) <= bounds.get("maxLength", 10 ** 9), value
            jsonschema.validate(value, schema)


@pytest.mark.parametrize("pattern", PATTERNS)
@SETTINGS
@given(data=st.data())
def test_strings_of_the_pattern_are_accepted(pattern, data):
    value = data.draw(st.from_regex(pattern))
    assume(ecma_match(pattern, value) and re.search(pattern, value))
    assert grammar({"type": "string", "pattern": pattern}).matches(dumps(value)), value


@pytest.mark.parametrize("pattern", PATTERNS)
@SETTINGS
@given(text=st.text(alphabet=st.sampled_from("aAbcxyz019-_.:@/ \t\n\"\\#é()"), max_size=12))
def test_the_grammar_accepts_exactly_the_matches(pattern, text):
    assert grammar({"type": "string", "pattern": pattern}).matches(dumps(text)) == ecma_match(pattern, text)


def test_classes_keep_what_both_engines_agree_on():
    # \d: ASCII digits (Python's re would also take '٣'); \s: not U+FEFF (ECMA-262 only) nor
    # U+001C (Python only); '.': not '\r' (ECMA-262 stops there, Python does not)
    g = grammar({"type": "string", "pattern": r"^\d\s.$"})
    assert g.matches(dumps("1 x")) and g.matches(dumps("7\u00a0é"))
    for bad in ["\u0663 x", "1\ufeffx", "1\x1cx", "1 \r", "1 \u2028"]:
        assert not g.matches(dumps(bad)), bad
    # a negated class excludes what either engine counts as its member
    neg = grammar({"type": "string", "pattern": r"^[^\d]$"})
    assert neg.matches(dumps("a")) and not neg.matches(dumps("5")) and not neg.matches(dumps("\u0663"))


def test_lengths_are_fitted_by_narrowing_repetitions():
    schema = {"type": "string", "pattern": r"^[a-z]+-[0-9]+$", "minLength": 6, "maxLength": 9}
    g = grammar(schema)
    assert g.matches('"abc-12"') and g.matches('"abc-123"')  # (a narrowing: 'ab-123' is valid, not produced)
    assert not g.matches('"a-1"') and not g.matches('"abcde-12345"')
    unanchored = grammar({"type": "string", "pattern": "ab", "maxLength": 4})
    assert unanchored.matches('"xaby"') and unanchored.matches('"ab"') and not unanchored.matches('"xxaby"')
    with pytest.raises(UnenforceableSchemaError, match="minLength/maxLength") as info:
        json_schema_to_gbnf({"type": "string", "pattern": r"^(?:a|bc)$", "minLength": 2})
    assert info.value.keyword == "pattern" and info.value.path == "#"
    with pytest.raises(GrammarError, match="admits no value"):
        json_schema_to_gbnf({"type": "string", "pattern": "^abc$", "maxLength": 2})


@pytest.mark.parametrize("pattern, construct", [
    ("(?=a)b", "lookahead"), ("(?<!a)b", "lookbehind"), (r"(a)\1", "backreference"), (r"\bword\b", "word boundary"),
    (r"\p{L}+", "Unicode property"), ("a^b", "anchor"), ("[]", "empty class"), ("(ab", "invalid"),
    (r"\a", "escape"), ("(?i)abc", "group modifier"), ("a**", "invalid"), ("[b-a]", "invalid"), (r"[\d-z]", "range"),
])
def test_untranslatable_patterns_are_typed_errors(pattern, construct):
    with pytest.raises(UnsupportedRegexError) as info:
        json_schema_to_gbnf({"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}})
    assert construct in info.value.construct and info.value.keyword == "pattern"
    assert info.value.path == "#/properties/s" and repr(pattern) in str(info.value)


def test_enum_values_are_filtered_by_the_pattern():
    g = grammar({"enum": ["ab", "b", "abc", 3], "pattern": "^a"})
    assert g.matches('"ab"') and g.matches('"abc"') and g.matches("3") and not g.matches('"b"')


# --------------------------------------------------------------------------------------
# patternProperties


def check_sound(schema, samples=40):
    g = grammar(schema)
    rnd = random.Random(json.dumps(schema))
    for _ in range(samples):
        text = g.sample(rnd, budget=rnd.choice([30, 80, 200]))
        jsonschema.validate(json.loads(text), schema)
    return g


def test_pattern_properties():
    schema = {"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "integer"}}, "additionalProperties": False}
    g = check_sound(schema)
    assert g.matches('{"x-ab":1,"x-c":2}') and g.matches("{}")
    assert not g.matches('{"x-ab":"s"}') and not g.matches('{"y":1}') and not g.matches('{"x-1":1}')
    # a declared property that matches a pattern is checked by both schemas
    both = {"type": "object", "properties": {"x-a": {"minimum": 5}}, "patternProperties": {"^x-": {"type": "integer"}}}
    g = check_sound(both)
    assert g.matches('{"x-a":7}') and not g.matches('{"x-a":3}') and not g.matches('{"x-a":"s"}')
    # disjoint patterns keep their own schemas; overlapping ones are checked by both
    typed = {"type": "object", "patternProperties": {"^S_": {"type": "string"}, "^I_": {"type": "integer"}}}
    g = check_sound(typed)
    assert g.matches('{"S_a":"x","I_b":1}') and not g.matches('{"S_a":1}') and not g.matches('{"I_b":"x"}')
    overlapping = {"type": "object", "patternProperties": {"^a": {"type": "integer"}, "b": {"minimum": 10}}}
    g = check_sound(overlapping)
    assert g.matches('{"ab":12}') and not g.matches('{"ab":5}')  # matches both: needs both
    # a pattern every key matches stands in for additionalProperties, declared keys excluded
    anything = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                "patternProperties": {".*": {"maxLength": 3}}}
    g = check_sound(anything)
    assert g.matches('{"id":1,"k":"v"}') and not g.matches('{"id":1,"id":"v"}') and not g.matches('{"id":1,"k":"vvvv"}')


def test_pattern_properties_in_the_wild():
    # Snowplow/Kubernetes shapes: a map of labels, a pattern-keyed map beside declared keys
    labels = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
              "patternProperties": {"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$": {"type": "string", "maxLength": 4}},
              "additionalProperties": False}
    check_sound(labels)


# --------------------------------------------------------------------------------------
# formats (pyllamaopt/grammar/formats.py): what the grammar produces passes jsonschema's format
# checks (jsonschema[format]: rfc3987, fqdn, rfc3339-validator, isoduration, ipaddress...)

FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
FORMAT_EXAMPLES = {
    "date": (["2024-02-29", "0001-01-01"], ["2023-02-29", "2024-13-01", "24-01-01"]),
    "time": (["23:59:59Z", "00:00:00.5+05:30"], ["24:00:00Z", "12:00:00"]),
    "date-time": (["2025-03-14T10:00:00Z"], ["2025-03-14 10:00:00Z", "2025-03-14T10:00:00"]),
    "duration": (["P1D", "PT1H30M", "P1Y2M3DT4H5M6S", "P3W"], ["P", "PT", "P1H", "1D", "P1DT"]),
    "uuid": (["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
    "ipv4": (["192.168.0.1", "0.0.0.0", "255.255.255.255"], ["256.1.1.1", "01.1.1.1", "1.2.3"]),
    "ipv6": (["::", "::1", "fe80::1", "2001:db8::8a2e:370:7334", "::ffff:192.0.2.1", "1:2:3:4:5:6:7:8"],
             ["1:2:3:4:5:6:7:8:9", ":1", "1::2::3", "12345::"]),
    "hostname": (["example.com", "a", "x-1.y"], ["-a.com", "a..b", "a_b.com", "a-.com"]),
    "email": (["joe.bloggs@example.com", "a+b@x"], ["joe", "@x.com", "a@b@c", "a..b@x"]),
    "uri": (["https://example.com/a/b?x=1#f", "urn:isbn:0451450523", "mailto:a@b.c", "http://[::1]:8080/"],
            ["//example.com", "example.com", "http://a b", "1http://x"]),
    "uri-reference": (["/a/b", "../x", "https://x.org", "?q=1", ""], ["a b", "%zz"]),
    "json-pointer": (["", "/a/0", "/~0~1"], ["a", "/~2"]),
    "relative-json-pointer": (["0", "1/a", "2#"], ["-1", "01", "/a"]),
}


@pytest.mark.parametrize("fmt", sorted(FORMAT_EXAMPLES))
def test_formats_produce_valid_strings(fmt):
    schema = {"type": "string", "format": fmt}
    g = grammar(schema)
    good, bad = FORMAT_EXAMPLES[fmt]
    for text in good:
        assert g.matches(dumps(text)), text
    for text in bad:
        assert not g.matches(dumps(text)), text
    rnd = random.Random(fmt)
    for _ in range(60):
        value = json.loads(g.sample(rnd, budget=rnd.choice([20, 60, 200])))
        jsonschema.validate(value, schema, format_checker=FORMAT_CHECKER)
    for bounds in ({"maxLength": 20}, {"minLength": 12, "maxLength": 30}):
        try:
            bounded = grammar({**schema, **bounds})
        except GrammarError:
            continue  # a format whose strings cannot be fitted to these lengths
        for _ in range(20):
            value = json.loads(bounded.sample(rnd, budget=rnd.choice([20, 60, 200])))
            jsonschema.validate(value, {**schema, **bounds}, format_checker=FORMAT_CHECKER)


def test_format_aliases_and_annotations():
    # a format whose strings include another's uses the other's grammar; "url" is read as "uri"
    assert json_schema_to_gbnf({"type": "string", "format": "iri"}) == json_schema_to_gbnf(
        {"type": "string", "format": "uri"})
    assert json_schema_to_gbnf({"type": "string", "format": "url"}) == json_schema_to_gbnf(
        {"type": "string", "format": "uri"})
    # a format JSON Schema does not define only annotates
    for fmt in ("int32", "path", "topic", "byte"):
        assert json_schema_to_gbnf({"type": "string", "format": fmt}) == json_schema_to_gbnf({"type": "string"})
    # enum values are filtered by the format
    g = grammar({"enum": ["2024-01-01", "soon", 1], "format": "date"})
    assert g.matches('"2024-01-01"') and g.matches("1") and not g.matches('"soon"')


def test_a_repetition_of_what_may_be_empty_is_written_as_one_repetition():
    """(a?){n} accepts what a{0,n} does; written as n copies of an optional rule, llama.cpp's grammar
    tracked every way to spread the a's over the copies: (a?){400} took seconds a token and
    ((a?){50}){50} minutes. The same strings, one repetition (the tests above check the strings)."""
    assert '"a"{0,400}' in json_schema_to_gbnf({"type": "string", "pattern": "^(a?){400}$"})
    nested = json_schema_to_gbnf({"type": "string", "pattern": "^((a?){50}){50}$"})  # a{0,2500}, in chunks
    assert "?{" not in nested and '"a"?' not in nested, nested
