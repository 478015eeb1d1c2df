"""JSON Schema → GBNF (pyllamaopt.grammar), checked without a model.

The grammars are parsed and run by an independent GBNF implementation (tests/gbnf_check.py,
after llama.cpp's parser). The properties checked, for the schemas of benchmarks/schemas.py
and for focused ones:

* completeness on the canonical form: every valid instance, written as json.dumps writes it
  (or compactly, for whitespace="compact") with the keys in schema order, is accepted;
* soundness: every document the grammar accepts is valid JSON and valid against the schema
  (random strings drawn from the grammar, and random mutations of valid instances, judged by
  the reference validator below, which follows JSON Schema and not the converter);
* what cannot be expressed exactly raises GrammarError with a message that says what to do.
"""
from __future__ import annotations

import datetime
import json
import math
import random
import re
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gbnf_check import GBNFSyntaxError, parse_gbnf
from pyllamaopt.errors import GrammarError, PyllamaoptError
from pyllamaopt.grammar import JSON_GBNF, WHITESPACE, json_schema_to_gbnf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from schemas import SCHEMAS  # noqa: E402

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
INT_MAX = 10 ** 16 - 1

_grammars: dict[tuple[str, str], Any] = {}


# The literal texts of the tests below are compact JSON: their grammars are compact unless a test
# says otherwise (the keywords' rules do not depend on the spacing; the default, spaced, is
# checked by the property tests and test_the_default_spelling_is_json_dumps_s)
def grammar(schema: Any, whitespace: str = "compact"):
    key = (json.dumps(schema, sort_keys=True), whitespace)
    if key not in _grammars:
        _grammars[key] = parse_gbnf(json_schema_to_gbnf(schema, whitespace=whitespace))
    return _grammars[key]


def dumps(value: Any, whitespace: str = "compact") -> str:
    """The canonical form's spacing: none, or json.dumps's (spaced; also accepted by free)."""
    return json.dumps(value, separators=(",", ":") if whitespace == "compact" else None, ensure_ascii=False)


def accepts(schema: Any, text: str, whitespace: str = "compact") -> bool:
    return grammar(schema, whitespace).matches(text)


# --------------------------------------------------------------------------------------
# reference validator: JSON Schema semantics (not the converter's canonical narrowing)


def resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def json_eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def is_type(v: Any, t: str) -> bool:
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    return {
        "null": v is None, "boolean": isinstance(v, bool), "string": isinstance(v, str),
        "array": isinstance(v, list), "object": isinstance(v, dict), "number": number,
        "integer": number and float(v).is_integer(),
    }[t]


_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-](\d\d):(\d\d))")


def format_ok(v: str, fmt: str) -> bool:
    if fmt == "date":
        if not re.fullmatch(r"\d{4}-\d\d-\d\d", v):
            return False
        try:
            datetime.date(int(v[:4]), int(v[5:7]), int(v[8:]))
        except ValueError:
            return False
        return True
    if fmt == "time":
        m = _TIME.fullmatch(v)
        return bool(m) and int(m[1]) < 24 and int(m[2]) < 60 and int(m[3]) <= 60 and (
            m[6] is None or (int(m[6]) < 24 and int(m[7]) < 60))
    if fmt == "date-time":
        parts = re.split("[Tt]", v)
        return len(parts) == 2 and format_ok(parts[0], "date") and format_ok(parts[1], "time")
    if fmt == "uuid":
        return bool(re.fullmatch(r"[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}", v))
    raise AssertionError(fmt)


def evaluated_keys(v: dict, s: Any, root: Any) -> set:
    """The keys of object v that s evaluates (annotation collection, for unevaluatedProperties):
    its properties and additionalProperties, and those of the subschemas v is valid against."""
    if not isinstance(s, dict):
        return set(v) if s is True else set()
    if "additionalProperties" in s or "unevaluatedProperties" in s:
        return set(v)
    keys = set(v) & set(s.get("properties", {}))
    subs = list(s.get("allOf", ())) + list(s.get("anyOf", ())) + list(s.get("oneOf", ()))
    subs += [resolve(root, s["$ref"])] if "$ref" in s else []
    for sub in subs:
        if valid(v, sub, root):
            keys |= evaluated_keys(v, sub, root)
    return keys


def valid(v: Any, s: Any, root: Any) -> bool:
    if s is True:
        return True
    if s is False:
        return False
    if "$ref" in s and not valid(v, resolve(root, s["$ref"]), root):
        return False
    if "type" in s:
        types = [s["type"]] if isinstance(s["type"], str) else s["type"]
        if not any(is_type(v, t) for t in types):
            return False
    if "enum" in s and not any(json_eq(v, e) for e in s["enum"]):
        return False
    if "const" in s and not json_eq(v, s["const"]):
        return False
    if not all(valid(v, sub, root) for sub in s.get("allOf", ())):
        return False
    if "anyOf" in s and not any(valid(v, sub, root) for sub in s["anyOf"]):
        return False
    if "oneOf" in s and sum(valid(v, sub, root) for sub in s["oneOf"]) != 1:
        return False
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", math.inf):
            return False
        if "format" in s and not format_ok(v, s["format"]):
            return False
    if is_type(v, "number"):
        if v < s.get("minimum", -math.inf) or v > s.get("maximum", math.inf):
            return False
        emin, emax = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        if emin is True and v <= s["minimum"] or emax is True and v >= s["maximum"]:
            return False
        if not isinstance(emin, bool) and emin is not None and v <= emin:
            return False
        if not isinstance(emax, bool) and emax is not None and v >= emax:
            return False
        # (on the decimal values, as pyllamaopt's check reads multipleOf: 0.07 is a multiple of 0.01)
        if "multipleOf" in s and Fraction(repr(v)) % Fraction(repr(s["multipleOf"])) != 0:
            return False
    if isinstance(v, dict):
        props = s.get("properties", {})
        if any(k not in v for k in s.get("required", ())):
            return False
        for k, x in v.items():
            if k in props:
                if not valid(x, props[k], root):
                    return False
            elif "additionalProperties" in s and not valid(x, s["additionalProperties"], root):
                return False
        if not s.get("minProperties", 0) <= len(v) <= s.get("maxProperties", math.inf):
            return False
        if "unevaluatedProperties" in s:
            keys = evaluated_keys(v, {k: x for k, x in s.items() if k != "unevaluatedProperties"}, root)
            if not all(valid(x, s["unevaluatedProperties"], root) for k, x in v.items() if k not in keys):
                return False
    if isinstance(v, list):
        prefix = s.get("prefixItems", s["items"] if isinstance(s.get("items"), list) else [])
        rest = s.get("additionalItems", True) if isinstance(s.get("items"), list) else s.get("items", True)
        for i, x in enumerate(v):
            if not valid(x, prefix[i] if i < len(prefix) else rest, root):
                return False
        if not s.get("minItems", 0) <= len(v) <= s.get("maxItems", math.inf):
            return False
        if s.get("uniqueItems") and any(json_eq(v[i], v[j]) for i in range(len(v)) for j in range(i)):
            return False
    return True


# --------------------------------------------------------------------------------------
# canonical instances of a schema (the supported subset), drawn with hypothesis

_KEY_ALPHABET = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters='"\\')
_any_json = st.recursive(
    st.none() | st.booleans() | st.integers(-INT_MAX, INT_MAX)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


def merge_objects(parts: list[dict]) -> dict:
    out: dict = {"type": "object", "properties": {}, "required": []}
    for p in parts:
        out["properties"].update(p.get("properties", {}))
        out["required"] += p.get("required", [])
    return out


def draw_time(draw) -> str:
    t = draw(st.times())
    text = t.strftime("%H:%M:%S")
    if draw(st.booleans()):
        text += "." + str(draw(st.integers(0, 10 ** 9 - 1))).zfill(draw(st.integers(9, 9)))[: draw(st.integers(1, 9))]
    if draw(st.booleans()):
        return text + "Z"
    return text + draw(st.sampled_from("+-")) + f"{draw(st.integers(0, 23)):02}:{draw(st.integers(0, 59)):02}"


def draw_number(draw, s: dict) -> Any:
    lo, hi = s.get("minimum"), s.get("maximum")
    elo, ehi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    if elo is not None:
        lo = elo
    if ehi is not None:
        hi = ehi
    if lo is None and hi is None:
        return draw(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-INT_MAX, INT_MAX))
    x = draw(st.floats(-1e15 if lo is None else lo, 1e15 if hi is None else hi, exclude_min=elo is not None,
                       exclude_max=ehi is not None).map(lambda f: round(f, draw(st.integers(0, 8)))))
    if "e" in repr(x) or not valid(x, s, s):  # bounded numbers are written without exponent
        x = (lo if elo is None else lo + 0.5) if lo is not None else (hi if ehi is None else hi - 0.5)
    if draw(st.booleans()) and float(x).is_integer() and abs(x) < 1e15:
        x = int(x)
    return x


def instance(draw, s: Any, root: Any, depth: int = 0) -> Any:
    """A valid instance of ``s`` in the converter's canonical form."""
    if s is True or s == {}:
        return draw(_any_json)
    if "$ref" in s:
        return instance(draw, resolve(root, s["$ref"]), root, depth)
    if "allOf" in s:
        parts = [resolve(root, p["$ref"]) if "$ref" in p else p for p in s["allOf"]]
        return instance(draw, merge_objects(parts), root, depth)
    if "anyOf" in s or "oneOf" in s:
        alts = s.get("anyOf") or s.get("oneOf")
        alt = alts[0] if depth > 3 else draw(st.sampled_from(alts))
        return instance(draw, alt, root, depth + 1)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return draw(st.sampled_from(s["enum"]))
    types = s.get("type", "object" if "properties" in s else None)
    types = [types] if isinstance(types, str) else types
    t = draw(st.sampled_from(types))
    if t == "null":
        return None
    if t == "boolean":
        return draw(st.booleans())
    if t == "integer":
        lo = s.get("minimum", -INT_MAX)
        hi = s.get("maximum", INT_MAX)
        if "exclusiveMinimum" in s:
            lo = s["exclusiveMinimum"] + 1
        return draw(st.integers(lo, hi))
    if t == "number":
        return draw_number(draw, s)
    if t == "string":
        fmt = s.get("format")
        if fmt == "date":
            return draw(st.dates()).isoformat()
        if fmt == "time":
            return draw_time(draw)
        if fmt == "date-time":
            return draw(st.dates()).isoformat() + "T" + draw_time(draw)
        if fmt == "uuid":
            return str(draw(st.uuids()))
        lo = s.get("minLength", 0)
        return draw(st.text(min_size=lo, max_size=min(s.get("maxLength", lo + 12), lo + 12)))
    if t == "array":
        prefix = [instance(draw, p, root, depth + 1) for p in s.get("prefixItems", [])]
        items = s.get("items", True if not prefix else False)
        if items is False:
            return prefix
        lo = s.get("minItems", 0)
        hi = min(s.get("maxItems", lo + 3), lo + 3) if depth < 3 else lo
        n = draw(st.integers(lo, hi))
        return prefix + [instance(draw, items, root, depth + 1) for _ in range(n)]
    # object: declared properties in schema order, then extra keys
    out = {}
    props = s.get("properties", {})
    for k, sub in props.items():
        if k in s.get("required", ()) or (depth < 3 and draw(st.booleans())):
            out[k] = instance(draw, sub, root, depth + 1)
    addl = s.get("additionalProperties", False if "properties" in s else True)
    if addl is not False and depth < 3:
        for k in draw(st.lists(st.text(_KEY_ALPHABET, max_size=6), max_size=2, unique=True)):
            if k not in props:
                out[k] = instance(draw, addl, root, depth + 1)
    return out


def mutate(rnd: random.Random, v: Any) -> Any:
    """A random small change somewhere in a JSON value."""
    if isinstance(v, dict) and v and rnd.random() < 0.7:
        k = rnd.choice(list(v))
        return {**v, k: mutate(rnd, v[k])}
    if isinstance(v, list) and v and rnd.random() < 0.7:
        i = rnd.randrange(len(v))
        return v[:i] + [mutate(rnd, v[i])] + v[i + 1:]
    choices = [0, -1, 7, 1.5, -2.25, 1000000, "", "x", "yes", "a" * 300, True, False, None, [], {}, [1], {"k": 1}]
    op = rnd.randrange(6)
    if op == 0 and isinstance(v, dict) and v:
        k = rnd.choice(list(v))
        return {x: y for x, y in v.items() if x != k}
    if op == 1 and isinstance(v, dict):
        return {**v, rnd.choice(["zz", "name", "id", "extra", "type"]): rnd.choice(choices)}
    if op == 2 and isinstance(v, str):
        return v + rnd.choice(["x", "x" * 250, "\n", "Z", "00"])
    if op == 3 and isinstance(v, list):
        return v + [rnd.choice(v + choices)] if rnd.random() < 0.5 else v[:-1]
    if op == 4 and isinstance(v, (int, float)) and not isinstance(v, bool):
        return rnd.choice([v + 1, v - 1, -v, v * 1000, v + 0.5, 10 ** 17])
    return rnd.choice(choices)


# --------------------------------------------------------------------------------------
# the benchmark schemas

NAMES = [name for name, _, _ in SCHEMAS]
BY_NAME = {name: schema for name, schema, _ in SCHEMAS}


def test_benchmark_schemas_are_many_short_and_convertible():
    assert len(SCHEMAS) >= 20 and len(set(NAMES)) == len(NAMES)
    for name, schema, prompt in SCHEMAS:
        assert isinstance(prompt, str) and 0 < len(prompt) < 200, name
        for whitespace in WHITESPACE:
            g = json_schema_to_gbnf(schema, whitespace=whitespace)
            assert g.startswith("root ::= ")
            parse_gbnf(g)  # llama.cpp's syntax and limits, no left recursion


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("whitespace", ["spaced", "compact"])
@SETTINGS
@given(data=st.data())
def test_valid_instances_are_accepted(name, whitespace, data):
    schema = BY_NAME[name]
    value = instance(data.draw, schema, schema)
    assert valid(value, schema, schema), value
    text = dumps(value, whitespace)
    assert accepts(schema, text, whitespace), text
    other = dumps(value, "compact" if whitespace == "spaced" else "spaced")
    if other != text:  # one spelling only
        assert not accepts(schema, other, whitespace)


@pytest.mark.parametrize("name", NAMES[::3])
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_pretty_printed_instances_are_accepted_with_free_whitespace(name, data):
    schema = BY_NAME[name]
    value = instance(data.draw, schema, schema)
    for text in (json.dumps(value, ensure_ascii=False), json.dumps(value, indent=2, ensure_ascii=False)):
        assert accepts(schema, text, "free"), text
    if isinstance(value, (dict, list)) and value:
        assert not accepts(schema, json.dumps(value, indent=2, ensure_ascii=False), "spaced")  # no free whitespace


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2 ** 32))
def test_invalid_documents_are_rejected(name, data, seed):
    schema = BY_NAME[name]
    value = instance(data.draw, schema, schema)
    rnd = random.Random(seed)
    for _ in range(6):
        bad = mutate(rnd, value)
        if not valid(bad, schema, schema):
            assert not accepts(schema, dumps(bad)), dumps(bad)


@pytest.mark.parametrize("name", NAMES)
def test_everything_the_grammar_produces_is_valid(name):
    schema = BY_NAME[name]
    g = grammar(schema)
    rnd = random.Random(name)
    for _ in range(25):
        text = g.sample(rnd, budget=rnd.choice([20, 60, 200]))
        value = json.loads(text)
        assert valid(value, schema, schema), text
        assert g.matches(text)


PET = {
    "$defs": {
        "Cat": {"properties": {"kind": {"const": "cat", "title": "Kind", "type": "string"},
                               "name": {"title": "Name", "type": "string"}},
                "required": ["kind", "name"], "title": "Cat", "type": "object"},
        "Dog": {"properties": {"kind": {"const": "dog", "type": "string"}, "barks": {"type": "boolean"}},
                "required": ["kind"], "title": "Dog", "type": "object"},
    },
    "properties": {
        "pet": {"discriminator": {"propertyName": "kind"}, "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]},
        "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Age"},
    },
    "required": ["pet"], "title": "Model", "type": "object",
}  # what pydantic writes for a discriminated union and an Optional[int]

FOCUSED = {
    "pydantic": PET,
    "all_of_additional": {"allOf": [
        {"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
        {"properties": {"b": {"type": "string", "maxLength": 3}}, "additionalProperties": {"maxLength": 5}}]},
    "odd_keys": {"type": "object", "properties": {"a-b]": {"type": "integer"}, 'say "hi"': {"type": "string"},
                                                  "é": {"const": 1}, "": {"type": "null"}},
                 "additionalProperties": {"type": "boolean"}},
    "number_bounds": {"type": "array", "items": {"type": "number", "exclusiveMinimum": -2, "maximum": 3}},
    "tuple": {"type": "array", "prefixItems": [{"type": "integer", "minimum": -5, "maximum": 5},
                                               {"enum": [1, "1", [1], {"a": None}]}],
              "items": {"type": "string", "format": "date"}, "minItems": 3, "maxItems": 5},
    "any_of_mixed": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "object", "required": ["x"]},
                               {"type": "number", "minimum": 1, "exclusiveMaximum": 2}]},
    "required_any": {"type": "object", "required": ["a"]},
    "anything": True,
    "unevaluated": {"allOf": [{"properties": {"a": {"type": "integer"}}}], "properties": {"b": {"const": 1}},
                    "unevaluatedProperties": {"type": "string", "format": "uuid"}},
    "recursive": {"$defs": {"t": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/t"}, {"type": "boolean"}]},
                                  "maxItems": 3}}, "$ref": "#/$defs/t"},
    "fractional_bounds": {"type": "array", "items": {"type": "number", "minimum": -0.5, "exclusiveMaximum": 2.25,
                                                     "multipleOf": 0.01}},
    "min_properties_one": {"type": "array", "items": {
        "anyOf": [{"type": "object", "properties": {k: {"type": "integer"} for k in "abcdef"}, "minProperties": 1},
                  {"type": "object", "properties": {"x": {"type": "null"}}, "additionalProperties": {"type": "null"},
                   "minProperties": 1}]}},
    "max_properties": {"type": "array", "items": {
        "anyOf": [{"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2},
                  {"type": "object", "properties": {"a": {"type": "null"}}, "required": ["a"],
                   "additionalProperties": {"type": "boolean"}, "minProperties": 1, "maxProperties": 3}]}},
}


@pytest.mark.parametrize("name", sorted(FOCUSED))
@pytest.mark.parametrize("whitespace", WHITESPACE)
def test_focused_schemas_produce_only_valid_documents(name, whitespace):
    schema = FOCUSED[name]
    g = grammar(schema, whitespace)
    rnd = random.Random(name)
    for _ in range(25):
        text = g.sample(rnd, budget=rnd.choice([15, 60, 150]))
        value = json.loads(text)
        assert valid(value, schema, schema), text
        assert g.matches(text)
        for _ in range(3):
            bad = mutate(rnd, value)
            if not valid(bad, schema, schema):
                assert not accepts(schema, dumps(bad, whitespace), whitespace), dumps(bad, whitespace)


def test_the_usual_mistakes_are_rejected():
    tool = BY_NAME["read_file"]
    good = {"name": "read_file", "arguments": {"path": "a.py", "start_line": 3}}
    assert accepts(tool, dumps(good))
    assert not accepts(tool, dumps({"name": "read_file"}))  # missing required key
    assert not accepts(tool, dumps({"name": "read_file", "arguments": {"path": "a.py"}}))
    assert not accepts(tool, dumps({"name": "read_file", "arguments": {"path": 5, "start_line": 3}}))  # type
    assert not accepts(tool, dumps({"name": "read_file", "arguments": {"path": "a", "start_line": "3"}}))
    assert not accepts(tool, dumps({"name": "read_file", "arguments": {"path": "a", "start_line": 0}}))  # minimum
    assert not accepts(tool, dumps({**good, "id": 1}))  # extra key, additionalProperties false
    assert not accepts(tool, dumps({"name": "write_file", "arguments": good["arguments"]}))  # const
    assert not accepts(tool, dumps({"arguments": good["arguments"], "name": "read_file"}))  # canonical order
    sentiment = BY_NAME["sentiment"]
    assert accepts(sentiment, '{"sentiment":"neutral","confidence":0.25}')
    assert not accepts(sentiment, '{"sentiment":"angry","confidence":0.25}')  # enum
    assert not accepts(sentiment, '{"sentiment":"neutral","confidence":1.5}')  # maximum
    commit = BY_NAME["commit_message"]
    ok = {"type": "fix", "scope": None, "subject": "x" * 72, "breaking": False}
    assert accepts(commit, dumps(ok))
    assert not accepts(commit, dumps({**ok, "subject": "x" * 73}))  # maxLength
    assert not accepts(commit, dumps({**ok, "subject": ""}))  # minLength
    assert accepts(commit, dumps({**ok, "scope": "docs"}))


# --------------------------------------------------------------------------------------
# any JSON value; strings


ANY_JSON_TEXTS = ['{"a":[1,2.5,-3e+10,true,null,"x\\n"]}', "[]", "{}", '"\\u00e9\\/"', "0", "-0.0", "1e-05",
                  '{"":{"":[]}}', '"😀"', "null", "false", "12345678901234567e+3"[:16]]


@pytest.mark.parametrize("schema", [True, {}, {"description": "anything"}])
def test_true_and_empty_schemas_accept_any_json(schema):
    assert json_schema_to_gbnf(schema) == JSON_GBNF
    for text in ANY_JSON_TEXTS:
        assert accepts(schema, text), text
    for text in ["", "{", "[1,]", "01", "+1", "1.", ".5", "NaN", "'x'", '{"a" :1}', "[1, 2]", '"\x01"', "tru"]:
        assert not accepts(schema, text), text


def test_json_gbnf_is_a_root_grammar():
    assert JSON_GBNF.startswith("root ::= ")
    parse_gbnf(JSON_GBNF)


def test_the_default_spelling_is_json_dumps_s():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array"},
                                               "c": {"enum": [{"x": [1, 2]}]}}}
    assert json_schema_to_gbnf(schema) == json_schema_to_gbnf(schema, whitespace="spaced")
    g = parse_gbnf(json_schema_to_gbnf(schema))
    value = {"a": 1, "b": [1, {"k": None}, []], "c": {"x": [1, 2]}}
    assert g.matches(json.dumps(value)) and g.matches("{}")
    assert not g.matches(dumps(value)) and not g.matches(json.dumps(value, indent=1))
    assert JSON_GBNF == json_schema_to_gbnf(True)
    with pytest.raises(ValueError, match="whitespace must be one of spaced, compact, free"):
        json_schema_to_gbnf(schema, whitespace="pretty")


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_any_json)
def test_any_json_value_is_accepted(value):
    assert accepts(True, dumps(value))
    assert accepts(True, json.dumps(value, indent=2), "free")


def test_string_escapes():
    s = {"type": "string"}
    for text in ['"a\\"b"', '"\\\\"', '"\\n\\t\\r\\b\\f\\/"', '"\\u0041\\u00E9"', '"é中😀"', '""', '"\x7f"']:
        assert accepts(s, text), text
    for text in ['"a"b"', '"\\"', '"\\x41"', '"\\u12"', '"\n"', '"\x00"', '"\x1f"', "'a'", '"a']:
        assert not accepts(s, text), text
    # a surrogate pair is one code point; a lone surrogate is not a character
    one = {"type": "string", "minLength": 1, "maxLength": 1}
    assert accepts(one, '"😀"') and accepts(one, '"\\ud83d\\ude00"') and accepts(one, '"\\uD83D\\uDE00"')
    for text in ['"\\ud83d"', '"\\ude00"', '"\\ude00\\ud83d"', '"\\ud83d\\u0041"', '"\\ud83dx"']:
        assert not accepts(s, text), text


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(0, 6), st.integers(0, 6), st.text(max_size=9))
def test_string_length_counts_code_points(lo, span, text):
    schema = {"type": "string", "minLength": lo, "maxLength": lo + span}
    assert accepts(schema, dumps(text)) == (lo <= len(text) <= lo + span)
    assert accepts(schema, json.dumps(text)) == (lo <= len(text) <= lo + span)  # \uXXXX, surrogate pairs


def test_long_strings_beyond_llama_cpps_repetition_limit():
    schema = {"type": "string", "minLength": 2100, "maxLength": 3210}
    g = json_schema_to_gbnf(schema)
    assert "{0,3210}" not in g and "{2100" not in g  # llama.cpp would make n > 2000 unbounded
    for n, ok in [(2099, False), (2100, True), (3210, True), (3211, False)]:
        assert accepts(schema, '"' + "a" * n + '"') == ok, n
    for n, ok in [(0, True), (2001, True), (2003, False)]:
        assert accepts({"type": "string", "maxLength": 2002}, '"' + "b" * n + '"') == ok, n
    big = {"type": "array", "items": {"type": "integer"}, "minItems": 2001}
    assert accepts(big, "[" + ",".join(["1"] * 2001) + "]")
    assert not accepts(big, "[" + ",".join(["1"] * 2000) + "]")


# --------------------------------------------------------------------------------------
# numbers


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(-300, 300), st.integers(0, 400), st.data())
def test_integer_ranges_are_exact(lo, span, data):
    schema = {"type": "integer", "minimum": lo, "maximum": lo + span}
    for v in {lo - 1, lo, lo + 1, lo + span - 1, lo + span, lo + span + 1, 0, -1,
              data.draw(st.integers(lo - 50, lo + span + 50))}:
        assert accepts(schema, str(v)) == (lo <= v <= lo + span), v
    assert not accepts(schema, "-0") and not accepts(schema, "01") and not accepts(schema, f"{lo}.0")


def test_integer_bounds_variants():
    assert accepts({"type": "integer", "exclusiveMinimum": 0}, "1")
    assert not accepts({"type": "integer", "exclusiveMinimum": 0}, "0")
    assert not accepts({"type": "integer", "exclusiveMaximum": 10}, "10")
    assert accepts({"type": "integer", "minimum": 0.5, "maximum": 2.5}, "2")
    assert not accepts({"type": "integer", "minimum": 0.5, "maximum": 2.5}, "0")
    assert accepts({"type": "integer", "minimum": 5, "exclusiveMinimum": True}, "6")  # draft 4
    assert not accepts({"type": "integer", "minimum": 5, "exclusiveMinimum": True}, "5")
    big = {"type": "integer", "minimum": 10 ** 15}
    assert accepts(big, str(INT_MAX)) and not accepts(big, str(INT_MAX + 1)) and not accepts(big, "999")
    assert accepts({"type": "integer"}, str(-INT_MAX)) and not accepts({"type": "integer"}, str(-INT_MAX - 1))
    assert accepts({"type": "integer", "multipleOf": 1}, "7")


@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.integers(-20, 20), st.integers(0, 30), st.booleans(), st.booleans(), st.data())
def test_number_ranges_are_exact(lo, span, exclusive_lo, exclusive_hi, data):
    hi = lo + span
    schema = {"type": "number", ("exclusiveMinimum" if exclusive_lo else "minimum"): lo,
              ("exclusiveMaximum" if exclusive_hi else "maximum"): hi}
    texts = [data.draw(st.from_regex(r"-?(0|[1-9][0-9]{0,2})(\.[0-9]{1,3})?", fullmatch=True)) for _ in range(8)]
    texts += [str(lo), str(hi), f"{lo}.0", f"{hi}.00", f"{hi}.01", f"{lo}.5", f"{hi - 1}.999", "-0.5", "0.0"]
    for text in texts:
        v = Fraction(text)
        inside = (v > lo if exclusive_lo else v >= lo) and (v < hi if exclusive_hi else v <= hi)
        assert accepts(schema, text) == inside, (text, schema)
    assert not accepts(schema, f"{lo}e0")  # bounded numbers are written without exponent


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.floats(-1000, 1000), st.floats(0, 500), st.integers(0, 4), st.booleans(), st.booleans(),
       st.sampled_from([None, 0.01, 0.1, 1, 1.0]), st.data())
def test_fractional_bounds_and_decimal_multiples_are_exact(lo, span, digits, exclusive_lo, exclusive_hi, multiple, data):
    from pyllamaopt.grammar import compile_json_schema

    lo, hi = round(lo, digits), round(lo + span, digits)
    schema = {"type": "number", ("exclusiveMinimum" if exclusive_lo else "minimum"): lo,
              ("exclusiveMaximum" if exclusive_hi else "maximum"): hi}
    if multiple is not None:
        schema["multipleOf"] = multiple
    try:
        compiled = compile_json_schema(schema)  # strict: everything here is enforced
    except GrammarError as e:
        assert "admits no value" in str(e)  # e.g. no multiple of 1 between 0.2 and 0.7
        return
    g = parse_gbnf(compiled.gbnf)
    places = {None: 5, 0.01: 2, 0.1: 1, 1: 0, 1.0: 0}[multiple]
    texts = [data.draw(st.from_regex(r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,5})?", fullmatch=True)) for _ in range(10)]
    for bound in (lo, hi):
        for x in (bound, math.nextafter(bound, math.inf), math.nextafter(bound, -math.inf), bound + 0.01, bound - 0.01):
            texts += [repr(x), f"{x:.{places}f}"]
    for text in texts:
        if "e" in text:
            continue
        v = Fraction(text)
        check = compiled.check(text).valid
        if g.matches(text):
            assert check, (text, schema)  # sound: jsonschema (floats compared as Python does) agrees
        fits = len(text.partition(".")[2]) <= places and len(text.lstrip("-").partition(".")[0]) <= 12
        inside = Fraction(repr(lo)) + Fraction(1, 10 ** 9) < v < Fraction(repr(hi)) - Fraction(1, 10 ** 9)
        if inside and fits and (multiple is None or (v / Fraction(repr(multiple))).denominator == 1):
            assert g.matches(text), (text, schema)  # complete, away from the bounds' rounding
    for bound, exclusive in ((lo, exclusive_lo), (hi, exclusive_hi)):
        text = repr(bound)  # an inclusive bound itself is produced
        if not exclusive and len(text.partition(".")[2]) <= places and (
                multiple is None or (Fraction(text) / Fraction(repr(multiple))).denominator == 1):
            assert g.matches(text) or g.matches(text.removesuffix(".0")), (text, schema)
    rnd = random.Random(repr(schema))
    for _ in range(20):
        text = g.sample(rnd, budget=40)
        assert compiled.check(text).valid, (text, schema)


def test_numbers():
    n = {"type": "number"}
    for text in ["0", "-1.5", "1e+20", "1.7976931348623157e+308", "5e-324", "0.30000000000000004", "1.0"]:
        assert accepts(n, text), text
    for text in ["01", "1.", ".5", "1e", "+1", "1E5", "NaN", "Infinity", "1e1234"]:
        assert not accepts(n, text), text
    assert accepts({"type": ["number", "integer"]}, "2.5")
    assert accepts({"type": "number", "minimum": 0}, "123456.75") and not accepts({"type": "number", "minimum": 0},
                                                                                  "-0.1")


# --------------------------------------------------------------------------------------
# objects, arrays, combinators


def test_optional_properties_keep_their_order():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                               "c": {"type": "integer"}}}
    for text in ["{}", '{"a":1}', '{"b":1}', '{"c":1}', '{"a":1,"b":2}', '{"a":1,"c":2}', '{"b":1,"c":2}',
                 '{"a":1,"b":2,"c":3}']:
        assert accepts(schema, text), text
    for text in ['{"b":1,"a":2}', '{"a":1,}', '{,"a":1}', '{"a":1,"a":1}', '{"d":1}']:
        assert not accepts(schema, text), text
    mixed = {**schema, "required": ["b"]}
    assert accepts(mixed, '{"a":1,"b":2}') and accepts(mixed, '{"b":2,"c":3}') and accepts(mixed, '{"b":2}')
    assert not accepts(mixed, '{"a":1}') and not accepts(mixed, '{"a":1,"c":3}')


def test_additional_properties():
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
              "additionalProperties": {"type": "string"}}
    assert accepts(schema, '{"id":1}') and accepts(schema, '{"id":1,"x":"a","ide":"b","i":"c","":"d"}')
    assert not accepts(schema, '{"id":1,"x":2}')
    assert not accepts(schema, '{"id":1,"id":"a"}')  # a declared key cannot come back as an extra one
    assert not accepts(schema, '{"x":"a","id":1}')  # declared properties first
    any_object = {"type": "object"}
    assert accepts(any_object, '{"a":[1,{"b":null}],"\\n":2}') and not accepts(any_object, "[]")
    no_extra = {"type": "object", "properties": {"id": {"type": "integer"}}}
    assert not accepts(no_extra, '{"id":1,"x":"a"}')  # absent additionalProperties: none (canonical form)
    typed = {"type": "object", "additionalProperties": {"type": "integer"}, "required": ["n"]}
    assert accepts(typed, '{"n":1,"m":2}') and not accepts(typed, '{"m":2}') and not accepts(typed, '{"n":"1"}')


def test_arrays_and_tuples():
    pair = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}
    assert accepts(pair, '["a",1]') and not accepts(pair, '["a"]') and not accepts(pair, '["a",1,2]')
    more = {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}, "maxItems": 3}
    assert accepts(more, '["a"]') and accepts(more, '["a",1,2]') and not accepts(more, '["a",1,2,3]')
    old = {"type": "array", "items": [{"const": 1}], "additionalItems": {"const": 2}}
    assert accepts(old, "[1,2,2]") and not accepts(old, "[1,1]")
    bounded = {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3}
    assert [accepts(bounded, "[" + ",".join(["true"] * n) + "]") for n in range(5)] == [False, False, True, True,
                                                                                          False]
    assert accepts({"type": "array", "maxItems": 0}, "[]") and not accepts({"type": "array", "maxItems": 0}, "[1]")
    assert accepts({"type": "array", "uniqueItems": True, "maxItems": 1}, "[1]")


def test_nullable_and_type_lists():
    schema = {"type": ["string", "null"], "maxLength": 2}
    assert accepts(schema, "null") and accepts(schema, '"ab"') and not accepts(schema, '"abc"')
    assert not accepts(schema, "1")
    enum = {"type": ["string", "null"], "enum": ["a", None, 3]}
    assert accepts(enum, '"a"') and accepts(enum, "null") and not accepts(enum, "3")


def test_enum_and_const_values_are_written_canonically():
    schema = {"enum": ["a\"b", 1, 2.5, True, None, [1, "x"], {"k": [None]}, "é"]}
    for v in schema["enum"]:
        assert accepts(schema, dumps(v)), v
    assert not accepts(schema, '"a"') and not accepts(schema, "1.0") and not accepts(schema, '{"k": [null]}')
    assert accepts({"type": "integer", "enum": [1.0, 2]}, "1")
    # keywords beside enum filter the values
    filtered = {"enum": ["a", "bb", 1, 5, [1, 2], {"k": 1}, {}], "maxLength": 1, "minimum": 2, "maxItems": 1,
                "required": ["k"]}
    assert [accepts(filtered, dumps(v)) for v in filtered["enum"]] == [True, False, False, True, False, True, False]
    assert accepts({"const": "\n"}, '"\\n"')


def test_refs_and_recursion():
    tree = BY_NAME["file_tree"]
    deep = {"name": "a", "kind": "dir", "children": [{"name": "b", "kind": "dir", "children": [
        {"name": "c", "kind": "file"}]}]}
    assert accepts(tree, dumps(deep))
    assert not accepts(tree, dumps({"name": "a", "kind": "dir", "children": [{"name": "b"}]}))
    root_ref = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    assert accepts(root_ref, '{"next":{"next":{}}}') and not accepts(root_ref, '{"next":1}')
    escaped = {"$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "string"}},
               "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}], "items": False}
    assert accepts(escaped, '[1,"x"]')
    beside = {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 1}
    assert accepts(beside, '"a"') and not accepts(beside, '"ab"')


def test_any_of_one_of_all_of():
    any_of = {"anyOf": [{"type": "integer", "minimum": 5}, {"type": "string"}, {"const": None}]}
    assert accepts(any_of, "7") and accepts(any_of, '"x"') and accepts(any_of, "null") and not accepts(any_of, "3")
    # siblings of anyOf apply to every alternative
    with_rest = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                 "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert accepts(with_rest, '{"a":1}') and accepts(with_rest, '{"b":1}') and not accepts(with_rest, "{}")
    ticket = BY_NAME["ticket"]
    t = {"id": "123e4567-e89b-12d3-a456-426614174000", "created": "2024-02-29T12:00:00Z", "title": "x",
         "priority": "low"}
    assert accepts(ticket, dumps(t)) and not accepts(ticket, dumps({k: v for k, v in t.items() if k != "id"}))
    merged = {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 9}, {"type": ["integer", "string"]}]}
    assert accepts(merged, "9") and not accepts(merged, "10") and not accepts(merged, '"a"')
    closed = {"allOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                        {"properties": {"b": {"type": "integer"}}}]}
    assert accepts(closed, '{"a":1}') and not accepts(closed, '{"a":1,"b":2}')  # b is forbidden by the first
    evaluated = {"allOf": [{"properties": {"a": {"type": "integer"}}}], "properties": {"b": {"const": 1}},
                 "unevaluatedProperties": False}
    assert accepts(evaluated, '{"a":1,"b":1}') and not accepts(evaluated, '{"a":1,"b":1,"c":1}')


def test_one_of_needs_exclusive_alternatives():
    for schema in [{"oneOf": [{"type": "string"}, {"type": "integer"}]},
                   {"oneOf": [{"const": "a"}, {"const": "b"}]},
                   BY_NAME["any_tool"], BY_NAME["agent_step"],
                   {"oneOf": [{"type": "object", "properties": {"a": {"const": 1}}},  # narrowed: 'a' required
                              {"type": "object", "properties": {"a": {"const": 2}}}]}]:
        json_schema_to_gbnf(schema)
    for schema in [{"oneOf": [{"type": "number"}, {"type": "integer"}]},
                   {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]},
                   {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                              {"type": "object", "properties": {"a": {"type": "number"}}}]}]:
        with pytest.raises(GrammarError, match="oneOf.*anyOf"):
            json_schema_to_gbnf(schema)


def test_formats():
    date = {"type": "string", "format": "date"}
    for text, ok in [("2024-02-29", True), ("2023-02-29", False), ("2000-02-29", True), ("1900-02-29", False),
                     ("2024-04-31", False), ("2024-12-31", True), ("2024-13-01", False), ("0000-01-01", False),
                     ("0004-02-29", True), ("2024-1-01", False), ("2024-01-00", False)]:
        assert accepts(date, dumps(text)) == ok == format_ok(text, "date"), text
    time = {"type": "string", "format": "time"}
    for text, ok in [("23:59:59Z", True), ("24:00:00Z", False), ("12:00:00", False), ("12:00:00.123+05:30", True),
                     ("12:60:00Z", False), ("12:00:00-23:59", True), ("12:00:00.Z", False)]:
        assert accepts(time, dumps(text)) == ok, text
    dt = {"type": "string", "format": "date-time"}
    assert accepts(dt, '"2025-03-14T10:00:00Z"') and not accepts(dt, '"2025-03-14 10:00:00Z"')
    uuid = {"type": "string", "format": "uuid"}
    assert accepts(uuid, '"123e4567-e89b-12d3-a456-426614174000"')
    assert not accepts(uuid, '"123e4567e89b12d3a456426614174000"')
    assert not accepts(uuid, '"123E4567-e89b-12d3-a456-426614174000"')  # lowercase: the canonical form


# --------------------------------------------------------------------------------------
# what is refused


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "pattern": "^(?!a)"}, "lookahead"),
    ({"type": "object", "patternProperties": {"\\1": {}}}, "backreference"),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames"),
    ({"not": {"enum": ["a", "b"]}}, "'not'"),
    ({"if": {"properties": {"a": {"const": 1}}}, "then": {"maxLength": 2}}, "'if'"),
    ({"type": "array", "contains": {"type": "string"}}, "contains"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "dependentRequired": {k: ["z"] for k in "abcde"}}, "dependentRequired"),
    ({"type": "string", "format": "uri-template"}, "format 'uri-template'"),
    ({"type": "string", "format": "email", "pattern": "@"}, "'pattern' and format 'email'"),
    ({"type": "string", "nullable": True}, "null"),
    ({"type": "strin"}, "unknown type"),
    ({"type": "string", "maxLenght": 3}, "unknown keyword 'maxLenght' looks like a misspelling of 'maxLength'"),
    ({"type": "object", "additonalProperties": False}, "misspelling of 'additionalProperties'"),
    ({"anyof": [{"type": "null"}]}, "misspelling of 'anyOf'"),
    ({"type:": "string"}, "misspelling of 'type'"),
    ({"type": "array", "itens": {"type": "string"}}, "misspelling of 'items'"),
    ({"type": "object", "requires": ["a"]}, "misspelling of 'required'"),
    ({"type": "integer", "multipleOf": 2}, "multipleOf"),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 2}, "minProperties"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": True, "maxProperties": 2}, "maxProperties"),
    ({"$ref": "https://example.com/s.json"}, "refers to another document"),
    ({"$ref": "#/$defs/missing"}, "does not resolve"),
    ({"$ref": "#foo"}, "anchor that no subschema declares"),
    ({"enum": ["2024-01-01"], "uniqueItems": True}, "'enum'/'const' cannot be combined with ['uniqueItems']"),
    ({"enum": []}, "admits no value"),
    (False, "admits no value"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "admits no value"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "admits no value"),
    ({"type": "string", "format": "date", "maxLength": 5}, "admits no value"),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}, "refers to itself"),
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, "includes itself"),
    ({"$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "required": ["n"]}},
      "$ref": "#/$defs/n"}, "infinitely nested"),
    ({"allOf": [{"format": "date"}, {"format": "time"}]}, "cannot be merged"),
    ({"type": "integer", "minimum": 10 ** 17}, "16 digits"),
    ({"type": "string", "maxLength": 3 * 10 ** 6}, "too large"),
    ({"properties": []}, "'properties' must be"),
    ({"required": "a"}, "'required' must be"),
    ({"type": "string", "minLength": -1}, "non-negative integer"),
    ("string", "must be a dict or a bool"),
])
def test_what_cannot_be_expressed_is_a_clear_error(schema, words):
    with pytest.raises(GrammarError) as info:
        json_schema_to_gbnf(schema)
    assert isinstance(info.value, PyllamaoptError) and isinstance(info.value, ValueError)
    assert words in str(info.value)


def test_annotations_and_extensions_are_ignored():
    plain = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    annotated = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "title": "T",
                 "description": "d", "examples": [{"a": 1}], "default": {"a": 1}, "x-vendor": 1, "$comment": "c",
                 "type": "object", "properties": {"a": {"type": "integer", "description": "n", "deprecated": True}},
                 "required": ["a"], "$defs": {"unused": {"pattern": "never converted"}}}
    assert json_schema_to_gbnf(annotated) == json_schema_to_gbnf(plain)
    # keywords JSON Schema does not define are annotations (as seen in JSONSchemaBench): draft-04
    # 'id', Snowplow's 'self', hyper-schema 'links', Kubernetes '_format', vendor keys; words that
    # only resemble a keyword ('cost', 'note', 'form', 'href', 'ip', 'item') are not typos
    wild = {"id": "http://example.com/s#", "self": {"vendor": "com.acme", "name": "ev", "format": "jsonschema",
                                                     "version": "1-0-0"},
            "links": [{"rel": "self", "href": "/a"}], "name": "n", "version": 2, "esriDocumentation": {"x": 1},
            "type": "object", "properties": {"a": {"type": "integer", "_format": "int32", "_uniqueItems": True,
                                                   "cost": 5, "note": "n", "form": "f", "href": "h", "ip": 1,
                                                   "item": 2, "readonly": True, "propertyOrder": 3}},
            "required": ["a"]}
    assert json_schema_to_gbnf(wild) == json_schema_to_gbnf(plain)


def test_ids_and_anchors_resolve_references():
    base = "http://example.com/root.json"
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "id": base, "type": "object",
              "definitions": {"a": {"id": "a.json", "type": "integer"}, "b": {"id": "#bee", "type": "boolean"}},
              "properties": {"x": {"$ref": "a.json"}, "y": {"$ref": "#bee"}, "z": {"$ref": base + "#/definitions/a"},
                             "w": {"$ref": "http://example.com/a.json"}},
              "required": ["x", "y", "z", "w"]}
    assert accepts(draft4, '{"x":1,"y":true,"z":2,"w":3}') and not accepts(draft4, '{"x":"1","y":true,"z":2,"w":3}')
    modern = {"$id": "https://example.com/schemas/order", "type": "array",
              "$defs": {"item": {"$anchor": "item", "type": "string", "maxLength": 2},
                        "nested": {"$id": "nested/", "$defs": {"n": {"$anchor": "n", "const": 7}}}},
              "prefixItems": [{"$ref": "#item"}, {"$ref": "nested/#n"}, {"$ref": "/schemas/order#/$defs/item"}],
              "items": False}
    assert accepts(modern, '["ab",7,"c"]') and not accepts(modern, '["abc",7,"c"]')
    assert not accepts(modern, '["ab",8,"c"]')
    draft7 = {"definitions": {"c": {"$id": "#cee", "type": "null"}}, "$ref": "#cee"}
    assert accepts(draft7, "null") and not accepts(draft7, "1")
    # an identifier inside data (an enum value, an example) is not a schema's
    data = {"$defs": {"e": {"enum": [{"$id": "#fake", "v": 1}]}, "t": {"const": 1}},
            "anyOf": [{"$ref": "#/$defs/e"}, {"$ref": "#/$defs/t"}], "examples": [{"$anchor": "fake"}]}
    assert accepts(data, '{"$id":"#fake","v":1}') and accepts(data, "1")
    with pytest.raises(GrammarError, match="anchor that no subschema declares"):
        json_schema_to_gbnf({"examples": [{"$anchor": "fake"}], "$ref": "#fake"})
    with pytest.raises(GrammarError, match="another document"):
        json_schema_to_gbnf({"$id": "http://example.com/a", "$ref": "http://example.com/b"})


def test_an_id_beside_a_ref_is_ignored_up_to_draft_7():
    # draft 7 and earlier ignore every keyword beside '$ref', '$id' included: the reference is
    # resolved against the enclosing base (as JSON Schema Store's cryproj schemas need)
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "$id": "https://example.com/root.json",
              "definitions": {"cvar": {"enum": ["r_Width", "r_Height"]}},
              "type": "object", "properties": {"name": {"$id": "/properties/name", "$ref": "#/definitions/cvar"}},
              "required": ["name"]}
    g = grammar(schema)
    assert g.matches('{"name":"r_Width"}') and not g.matches('{"name":"x"}')


def test_unsatisfiable_branches_are_dropped_not_errors():
    assert accepts({"anyOf": [{"type": "integer", "minimum": 3, "maximum": 1}, {"type": "null"}]}, "null")
    optional_false = {"type": "object", "properties": {"a": False, "b": {"type": "integer"}}}
    assert accepts(optional_false, '{"b":1}') and not accepts(optional_false, '{"a":1}')
    assert accepts({"type": "array", "prefixItems": [{"type": "integer"}, False], "items": {}}, "[1]")


def test_output_is_deterministic_and_uses_valid_rule_names():
    for _, schema, _ in SCHEMAS:
        text = json_schema_to_gbnf(schema)
        assert text == json_schema_to_gbnf(schema)
        for line in text.splitlines():
            assert re.fullmatch(r"[a-z0-9-]+ ::= .+", line), line


def test_the_checker_refuses_what_llama_cpp_refuses():
    with pytest.raises(GBNFSyntaxError):
        parse_gbnf('root ::= root "a" | "b"\n')  # left recursion
    with pytest.raises(GBNFSyntaxError):
        parse_gbnf('root ::= ("a"?)*\n')  # x ::= "a"? x | (empty): left recursive (stricter than llama.cpp)
    with pytest.raises(GBNFSyntaxError):
        parse_gbnf("root ::= x\n")  # undefined rule
    with pytest.raises(GBNFSyntaxError):
        parse_gbnf('root ::= ("a" "b"){3000}\n')
    assert parse_gbnf('root ::= "a"{0,2001}\n').matches("a" * 2100)  # llama.cpp: n > 2000 means unbounded


# --------------------------------------------------------------------------------------
# strict=False: what a grammar cannot enforce is left out (and listed), the rest is enforced

RELAXABLE = [  # (schema, the keyword left out, the schema without it: what the grammar enforces)
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3}, "uniqueItems": True, "maxItems": 3},
     "uniqueItems", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3}, "maxItems": 3}),
    ({"oneOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 3}]}, "oneOf",
     {"anyOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 3}]}),
    ({"type": "integer", "minimum": 0, "maximum": 4, "not": {"enum": [1, 2]}}, "not",
     {"type": "integer", "minimum": 0, "maximum": 4}),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, "if",
     {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}),
    ({"type": "number", "minimum": 0, "maximum": 9, "multipleOf": 0.25}, "multipleOf",
     {"type": "number", "minimum": 0, "maximum": 9}),
    ({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}, "minProperties": 2},
     "minProperties", {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}}),
    ({"type": "string", "pattern": "^(?!x)[a-z]{1,4}$"}, "pattern", {"type": "string"}),
    ({"type": "string", "format": "email", "pattern": "^[a-z]+$"}, "format", {"type": "string", "pattern": "^[a-z]+$"}),
    ({"type": "string", "format": "uri-template"}, "format", {"type": "string"}),
    ({"type": "object", "properties": {"x": {"$ref": "https://example.com/other.json"}}, "required": ["x"]}, "$ref",
     {"type": "object", "properties": {"x": True}, "required": ["x"]}),
    ({"enum": [[1, 2], [3]], "items": {"maximum": 2}}, "items", {"enum": [[1, 2], [3]]}),
    ({"type": "string", "pattern": "^(?:a|bc)$", "minLength": 2}, "pattern", {"type": "string", "pattern": "^(?:a|bc)$"}),
    # a misspelling is what JSON Schema says it is, an annotation (jsonschema ignores it too)
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additonalProperties": False}, "additonalProperties",
     {"type": "object", "properties": {"a": {"type": "integer"}}}),
]


@pytest.mark.parametrize("schema, keyword, enforced", RELAXABLE, ids=[k for _, k, _ in RELAXABLE])
def test_strict_refuses_and_non_strict_relaxes(schema, keyword, enforced):
    import jsonschema

    from pyllamaopt.errors import UnenforceableSchemaError
    from pyllamaopt.grammar import compile_json_schema

    with pytest.raises(UnenforceableSchemaError) as info:
        compile_json_schema(schema)
    assert info.value.keyword == keyword and info.value.path is not None
    relaxed = compile_json_schema(schema, strict=False)
    assert not relaxed.exact and [r.keyword for r in relaxed.relaxed][0] == keyword
    assert relaxed.relaxed[0].reason == str(info.value)
    g = parse_gbnf(relaxed.gbnf)
    full = jsonschema.Draft202012Validator(schema)
    rnd = random.Random(keyword)
    for _ in range(30):
        text = g.sample(rnd, budget=rnd.choice([20, 60, 150]))
        jsonschema.validate(json.loads(text), enforced)  # everything else is enforced
        check = relaxed.check(text)
        if keyword == "$ref":
            assert check.valid is None and "could not be checked" in check.error  # jsonschema cannot either
        elif keyword != "format":  # (jsonschema's check of these formats is covered in test_regex.py)
            assert check.valid == full.is_valid(json.loads(text)), text


def test_non_strict_exact_schemas_are_exact():
    from pyllamaopt.grammar import compile_json_schema

    for name in NAMES:
        compiled = compile_json_schema(BY_NAME[name], strict=False)
        assert compiled.exact and compiled.gbnf == json_schema_to_gbnf(BY_NAME[name])
    assert compile_json_schema({"type": "integer"}).check("12").valid is True
    bad = compile_json_schema({"type": "integer"}).check("1.5")
    assert bad.valid is False and "not of type 'integer'" in bad.error
    assert compile_json_schema({"type": "integer"}).check("1 2").valid is False  # not one JSON value
    # multipleOf on the decimal value (jsonschema alone would divide floats: 0.07 / 0.01 = 7.000000000000001)
    assert compile_json_schema({"multipleOf": 0.01}, strict=False).check("0.07").valid is True
    assert compile_json_schema({"multipleOf": 0.01}, strict=False).check("0.075").valid is False


REWRITTEN = {  # constraints a grammar enforces once rewritten into alternatives (exact)
    "dependencies": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                      "c": {"type": "null"}},
                      "dependencies": {"a": ["b"], "c": {"required": ["a"]}}},
                     ['{"a":1,"b":2}', '{"b":2}', "{}", '{"a":1,"b":2,"c":null}'], ['{"a":1}', '{"b":1,"c":null}']),
    "dependentRequired": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "required": ["b"], "dependentRequired": {"b": ["a"]}}, ['{"a":1,"b":2}'], ['{"b":2}']),
    "not-required": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "not": {"required": ["a", "b"]}}, ['{"a":1}', '{"b":1}', "{}"], ['{"a":1,"b":2}']),
    "not-type": ({"type": ["string", "integer", "null"], "not": {"type": "integer"}}, ['"x"', "null"], ["1"]),
    "if-then-else": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "if": {"required": ["a"]}, "then": {"required": ["b"]}, "else": {"properties": {"b": False}}},
                     ['{"a":1,"b":2}', "{}"], ['{"a":1}', '{"b":2}']),
    "oneOf-required": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, ['{"a":1}', '{"b":1}'],
                       ['{"a":1,"b":2}', "{}"]),
    # oneOf alternatives narrowed until no two overlap
    "oneOf-optional-discriminator": ({"type": "object", "oneOf": [
        {"properties": {"kind": {"enum": ["callback"]}, "value": {"type": "string"}}},
        {"properties": {"kind": {"enum": ["field", "value"]}, "value": {"type": ["string", "null"]}}}]},
        ['{"kind":"callback","value":"x"}', '{"kind":"field","value":null}'], ["{}", '{"value":"x"}']),
    "oneOf-different-required": ({"oneOf": [
        {"type": "object", "required": ["delete"], "properties": {"delete": {"type": "integer"}}},
        {"type": "object", "required": ["insert"], "properties": {"insert": {"type": "string"}}},
        {"type": "object", "required": ["x"], "additionalProperties": {"type": "boolean"}}]},
        ['{"delete":1}', '{"insert":"a"}', '{"x":true}', '{"x":true,"y":false}'],
        ['{"delete":1,"insert":"a"}', '{"x":true,"delete":true}', '{"x":true,"insert":true}']),
    "oneOf-enums": ({"oneOf": [{"enum": ["red", "blue", 3]}, {"enum": ["blue", "orange", 6, 3]}]},
                    ['"red"', '"orange"', "6"], ['"blue"', "3"]),
    "oneOf-any-and-string": ({"oneOf": [{}, {"type": "string"}, {"type": "string", "maxLength": 2}]},
                             ["1", "null", '{"a":"x"}'], ['"x"', '"long"']),
    "oneOf-closed-objects": ({"type": "array", "items": {"oneOf": [
        {"type": "object", "properties": {"ios": {"type": "integer"}}, "required": ["ios"],
         "additionalProperties": False},
        {"type": "object", "patternProperties": {"^[0-9]x$": {"type": "integer"}}, "additionalProperties": False},
        {"type": "object", "properties": {"ref": {"type": "string"}}, "additionalProperties": False}]}},
        ['[{"ios":1},{"ref":"a"}]', '[{"1x":2}]'], ['[{"ios":1,"ref":"a"}]', "[{}]"]),
}


@pytest.mark.parametrize("name", sorted(REWRITTEN))
def test_rewritten_keywords_are_enforced_exactly(name):
    import jsonschema

    schema, good, bad = REWRITTEN[name]
    g = grammar(schema)
    for text in good:
        assert g.matches(text), text
    for text in bad:
        assert not g.matches(text), text
    check = jsonschema.Draft202012Validator(schema)
    rnd = random.Random(name)
    for _ in range(60):
        text = g.sample(rnd, budget=rnd.choice([20, 60]))
        assert check.is_valid(json.loads(text)), text


def test_many_optional_properties_make_a_grammar_llama_cpp_takes():
    # JSONSchemaBench has objects with 50+ optional properties: one alternative per first
    # property present grows with the square of their number, and a repeated group holding
    # thousands of rules is refused by llama.cpp ("exceeds sane defaults", as gbnf_check does)
    names = [f"p{i}" for i in range(60)]
    schema = {"type": "object", "properties": {n: {"enum": ["ON", "OFF"]} for n in names},
              "additionalProperties": {"type": "integer", "maximum": 9}}
    text = json_schema_to_gbnf(schema)
    assert len(text) < 20000
    g = grammar(schema)
    assert g.matches("{}") and g.matches('{"p3":"ON","p59":"OFF"}') and g.matches('{"p0":"ON","x":1}')
    assert g.matches('{"x":1,"y":2}') and not g.matches('{"p59":"ON","p3":"OFF"}') and not g.matches('{"p1":1}')
    assert not g.matches('{"p1":"ON",}') and not g.matches('{,"p1":"ON"}') and not g.matches('{"x":10}')


def test_each_definition_an_allof_includes_is_merged_once(monkeypatch):
    """allOf is idempotent: a chain of 40 definitions, each the allOf of the previous one twice,
    merges each definition once (it followed 2**40 references: a 3 KB schema never compiled)."""
    from pyllamaopt.grammar import composition

    followed = []
    resolve = composition._resolve

    def counting(root: Any, ref: str, path: str) -> Any:
        followed.append(ref)
        if len(followed) > 10_000:
            raise AssertionError("references followed again and again")
        return resolve(root, ref, path)

    monkeypatch.setattr(composition, "_resolve", counting)
    defs = {"d0": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}
    for k in range(1, 41):
        defs[f"d{k}"] = {"allOf": [{"$ref": f"#/$defs/d{k - 1}"}, {"$ref": f"#/$defs/d{k - 1}"}]}
    gbnf = json_schema_to_gbnf({"$defs": defs, "$ref": "#/$defs/d40"})
    parse_gbnf(gbnf)
    assert len(followed) <= 2 * 41
    alone = json_schema_to_gbnf({"$defs": {"d0": defs["d0"]}, "$ref": "#/$defs/d0"})
    assert gbnf.replace("d40", "d0") == alone  # the same constraints (the rule named after the definition)


def test_a_one_of_of_many_constants_compares_only_what_may_overlap(monkeypatch):
    """oneOf alternatives that list their values overlap only where they share one: 3000 constants
    and a string need a few thousand disjointness tests, not every pair (4.5 million: 5000
    constants took a minute), and the overlaps are still found."""
    from pyllamaopt.grammar import composition

    tests = []
    disjoint = composition._disjoint

    def counting(root: Any, a: Any, b: Any, depth: int) -> bool:
        tests.append(depth)
        return disjoint(root, a, b, depth)

    monkeypatch.setattr(composition, "_disjoint", counting)
    n = 3000
    g = grammar({"oneOf": [{"const": i} for i in range(n)] + [{"type": "string"}]})
    assert len(tests) <= 3 * n
    assert g.matches("2999") and g.matches('"x"') and not g.matches("3000") and not g.matches("2.5")
    # shared values are still told apart: 1 is in two alternatives, so neither may produce it
    tests.clear()
    g = grammar({"oneOf": [{"enum": [1, 2]}, {"enum": [1, 3]}] + [{"const": 10 + i} for i in range(n)]})
    assert len(tests) <= 3 * n
    assert g.matches("2") and g.matches("3") and g.matches("3009") and not g.matches("1")
