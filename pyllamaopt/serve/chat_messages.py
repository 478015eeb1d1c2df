"""The chat message model both chat surfaces convert their requests into (OpenAI's and Anthropic's
shapes alike): turns with their text, tool calls and tool results, the tools offered and the
tool choice; and the conversions of a message's parts every surface shares."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import BadRequest

ChoiceMode = Literal["auto", "required", "none"]

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}  # arguments {}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]  # JSON Schema of the arguments (an object)


@dataclass(frozen=True)
class ToolChoice:
    mode: ChoiceMode = "auto"
    name: str | None = None  # with "required": this function only
    parallel: bool = True    # False: at most one call a reply


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object; in a reply, exactly as the model wrote it
    sent: str | None = None  # in a request: the arguments' text as the client sent it (the native format's history)


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    content: str
    is_error: bool = False


@dataclass
class Turn:
    """A message in neither surface's shape: results (user) come before the text, calls
    (assistant) after it."""

    role: str
    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    reasoning: str = ""  # assistant: its reasoning as sent back (OpenAI's reasoning_content, Anthropic's thinking)


def compact(value: Any) -> str:
    """JSON text as the grammar writes it (and json_values.compact does): no spaces, keys in order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def arguments_text(arguments: Any, where: str) -> str:
    """A call's arguments as the model would have written them: a JSON object's text, verbatim
    if compact (our replies are), else re-written compactly. Not JSON, or not an object: 400."""
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError) as exc:  # not JSON; a number of 4300+ digits; nested too deep
            raise BadRequest(f"{where} is not JSON we can read ({exc}): send the arguments as a JSON object's "
                             "text") from None
        text = arguments if not _free_whitespace(arguments) else compact(value)
    else:
        value, text = arguments, compact(arguments)
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be a JSON object, got {compact(value)[:80]}")
    return text


def _free_whitespace(text: str) -> bool:
    """Whether JSON `text` has whitespace outside its strings."""
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in " \t\r\n":
            return True
    return False


def text_of(content: str | list[dict[str, Any]] | None, where: str) -> str:
    """A message's text: a string, or the text of its parts / blocks (OpenAI's and Anthropic's
    shapes agree on {"type": "text", "text": ...}); other kinds are a 400."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks, got {compact(content)[:80]}")
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise BadRequest(f"{where}: content parts must be of type 'text' (got {kind!r}): "
                             "this server takes text only")
        parts.append(part["text"])
    return "".join(parts)


def new_call_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"
