"""A chat reply in the model's own format (native_prompt.py), read by llama.cpp's parser for the
template's format (common/chat, as llama-server reads it): the text, the reasoning (<think> and
the formats' equivalents) and the tool calls in the model's syntax.

The text and the reasoning are passed on as they come (each partial parse's growth); a call only
when the reply ends and parses whole, so that a call the model breaks off never reaches a client
as a call: the reply is then text (``Reply.malformed`` says why), ending with the generation's
finish reason (``malformed_call`` if the model itself ended it)."""
from __future__ import annotations

import json
from typing import Any

from ..errors import ChatTemplateError
from .chat_messages import ToolCall, new_call_id
from .reply_parser import ArgumentsPiece, CallEnd, CallStart, Piece, ReasoningPiece, Reply, TextPiece


class NativeReplyParser:
    """ReplyParser's interface (feed, finish, result, end_reason, stop_string) over llama.cpp's parser."""

    end_reason = None  # (the engine's stop strings and its own end end a native reply)
    stop_string = None

    def __init__(self, parser: Any, id_prefix: str, tool_format: str) -> None:
        self._parser = parser
        self._id_prefix = id_prefix
        self._tool_format = tool_format
        self._buf = ""
        self.text = ""
        self.reasoning = ""
        self.calls: list[ToolCall] = []
        self.complete = False
        self.malformed: str | None = None

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        try:
            message = json.loads(self._parser.parse(self._buf, True))
        except ChatTemplateError:  # (a partial parse does not fail on a reply cut short)
            return []
        return self._grown(message)

    def finish(self) -> list[Piece]:
        """The reply parsed whole: what its text and reasoning still add, then its calls; a reply
        that does not parse (a call broken off) is text from where the parsed text ends."""
        try:
            message = json.loads(self._parser.parse(self._buf, False))
        except ChatTemplateError as exc:
            return self._as_text(str(exc))
        calls = message.get("tool_calls") or ()
        for call in calls:  # (llama.cpp's parse is lenient: a call cut inside its arguments still parses)
            function = call.get("function") or {}
            try:
                arguments = json.loads(function.get("arguments") or "")
            except json.JSONDecodeError as exc:
                return self._as_text(f"the call of {function.get('name')!r} is cut short or its arguments are not "
                                     f"JSON ({exc})")
            if not isinstance(arguments, dict):
                return self._as_text(f"the arguments of the call of {function.get('name')!r} are not a JSON object")
        out = self._grown(message)
        for call in calls:
            function = call.get("function") or {}
            made = ToolCall(call.get("id") or new_call_id(self._id_prefix), function.get("name", ""),
                            function.get("arguments", ""))
            index = len(self.calls)
            self.calls.append(made)
            out += [CallStart(index, made.id, made.name), ArgumentsPiece(index, made.arguments), CallEnd(index)]
        self.complete = True
        return out

    def _as_text(self, why: str) -> list[Piece]:
        """The reply is text from where the text passed on so far ends: it began a call that cannot be read."""
        self.malformed = why
        at = self._buf.find(self.text) + len(self.text) if self.text and self.text in self._buf else 0
        rest = self._buf[at:]
        self.text += rest
        return [TextPiece(rest)] if rest else []

    def result(self) -> Reply:
        return Reply(self.text, tuple(self.calls), self.complete, self.reasoning, self._tool_format, self.malformed)

    def _grown(self, message: dict[str, Any]) -> list[Piece]:
        """What the parse adds to the reasoning and the text passed on so far (a parse that takes back
        text, a tag's start becoming markup, adds nothing until it grows past what was passed on)."""
        out: list[Piece] = []
        reasoning = message.get("reasoning_content") or ""
        if len(reasoning) > len(self.reasoning) and reasoning.startswith(self.reasoning):
            out.append(ReasoningPiece(reasoning[len(self.reasoning):]))
            self.reasoning = reasoning
        content = message.get("content") or ""
        if len(content) > len(self.text) and content.startswith(self.text):
            out.append(TextPiece(content[len(self.text):]))
            self.text = content
        return out
