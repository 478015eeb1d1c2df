"""The grammar of a chat reply with tools: the generic format's JSON (chat_prompt.py says what it
is), its alternatives as tool_choice picks them, each call's arguments as its tool's parameters."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import GrammarError
from ..grammar import json_schema_to_gbnf
from .chat_messages import Tool, ToolChoice
from .errors import BadRequest


def reply_schema(tools: Sequence[Tool], choice: ToolChoice) -> dict[str, Any]:
    """The JSON Schema of a reply: calls of `tools` and/or a text response, as `choice` says."""
    response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                "additionalProperties": False}
    if choice.mode == "none":
        return response
    chosen = [i for i, t in enumerate(tools) if choice.name in (None, t.name)]
    if not chosen:
        raise BadRequest(f"tool_choice names the function {choice.name!r}, which is not among the tools "
                         f"({', '.join(t.name for t in tools)})")
    defs = {f"tool{i}": _parameters(tools[i], f"#/$defs/tool{i}") for i in chosen}
    calls = [_call_schema(tools[i], f"tool{i}") for i in chosen]
    array: dict[str, Any] = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
                             "minItems": 1}
    if not choice.parallel:
        array["maxItems"] = 1
    tool_calls = {"type": "object", "properties": {"tool_calls": array}, "required": ["tool_calls"],
                  "additionalProperties": False}
    schema = tool_calls if choice.mode == "required" or choice.name is not None else {"anyOf": [tool_calls, response]}
    return {**schema, "$defs": defs}


def reply_grammar(tools: Sequence[Tool], choice: ToolChoice) -> str:
    """`reply_schema` as GBNF. A parameter schema the grammar engine cannot express is a 400
    naming its tool, whether or not tool_choice lets the tool be called this turn."""
    try:
        grammar = json_schema_to_gbnf(reply_schema(tools, choice), whitespace="compact")
    except GrammarError as exc:
        _check_parameters(tools)
        raise BadRequest(f"the tools' reply grammar cannot be built: {exc}") from None
    if choice.mode == "none" or choice.name is not None:  # not every tool was in it
        _check_parameters(tools)
    return grammar


def _check_parameters(tools: Sequence[Tool]) -> None:
    for i, t in enumerate(tools):
        try:
            json_schema_to_gbnf(_parameters(t, "#"))
        except GrammarError as exc:
            raise BadRequest(f"tools[{i}] ({t.name}): its parameters cannot be used: {exc}") from None


def _call_schema(tool: Tool, key: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": tool.name}, "arguments": {"$ref": f"#/$defs/{key}"}},
            "required": ["name", "arguments"], "additionalProperties": False}


def _parameters(tool: Tool, base: str) -> dict[str, Any]:
    """The tool's parameter schema, placed at `base` of the reply's schema: its local references
    rebased there, 'type: object' made explicit."""
    return {"type": "object", **_rebased(tool.parameters, base)}


_VALUES = {"const", "enum", "default", "examples"}  # keywords whose value is data, not a schema
_SCHEMA_MAPS = {"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"}  # name -> schema


def _rebased(node: Any, base: str) -> Any:
    if isinstance(node, list):
        return [_rebased(v, base) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):  # a pointer ("#name": an anchor)
            out[k] = base + v[1:]
        elif k in _VALUES:
            out[k] = v
        elif k in _SCHEMA_MAPS and isinstance(v, dict):
            out[k] = {name: _rebased(s, base) for name, s in v.items()}
        else:
            out[k] = _rebased(v, base)
    return out
