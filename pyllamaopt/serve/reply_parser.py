"""A chat reply parsed as it streams: the text for the user and the tool calls it holds so far, in
pieces a stream passes on as they come. The service parses each reply once, on the scheduler
thread, and its events carry the pieces and the end result to the routes."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..stop_strings import find_stop, held_back
from .chat_messages import ToolCall, new_call_id


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class ReasoningPiece:
    text: str  # the model's thinking (native formats: <think>...</think> and the like)


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsPiece:
    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    index: int


Piece = TextPiece | ReasoningPiece | CallStart | ArgumentsPiece | CallEnd


@dataclass(frozen=True)
class Reply:
    """A reply as parsed by the end of its generation (ReplyParser.result)."""

    text: str
    calls: tuple[ToolCall, ...]
    complete: bool
    reasoning: str = ""
    tool_format: str = "none"  # ReplyFormat.tool_format
    malformed: str | None = None  # native: why a call the reply began could not be read (it is then text)

    @property
    def called_tools(self) -> bool:
        """A whole reply that calls tools (its finish reason says so)."""
        return self.complete and bool(self.calls)

_ESCAPE = re.compile(r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})')


class ReplyParser:
    """Reads a reply as its text arrives (``feed``) and says what it holds so far: text for the
    user (a generic ``response``, or the whole reply without tools) and calls, the arguments
    piece by piece. Streaming and not go through it alike, so they agree.

    A reply's calls are distinct: a call equal to an earlier one of the same reply (name and
    arguments text) ends the reply there (``repeated``; it is left out, the reply is complete).
    A small model otherwise repeats its call until max_tokens, and a client would run a tool with
    side effects twice. So that a repeat is never half sent, a call's pieces are held back while
    its text so far may still become an earlier call's.

    `stop` (a generic reply): stop strings of the answer's decoded text — the first ends the reply
    there (``stop_string``; the text before it kept), and an end of the text that may still become
    one is held back until it does not."""

    def __init__(self, generic: bool, id_prefix: str, stop: Sequence[str] = (), tool_format: str = "none") -> None:
        self._id_prefix = id_prefix
        self._tool_format = tool_format
        self._buf = ""
        self._pos = 0
        self._state = "start" if generic else "raw"
        self._depth = 0
        self._in_string = self._escaped = False
        self._args_from = 0
        self._held: list[Piece] = []  # the current call's pieces, while it may repeat an earlier call
        self._stop = [x for x in stop if x] if generic else []
        self._text_held = ""  # the answer's text that may still become a stop string
        self.text = ""
        self.calls: list[ToolCall] = []
        self.repeated = False
        self.stop_string: str | None = None

    @property
    def complete(self) -> bool:
        """The reply is a whole generic JSON object (its calls are whole), or ended by a repeated call."""
        return self._state == "done"

    @property
    def end_reason(self) -> str | None:
        """Why the reply ended before its JSON did, if it did: a repeated call, or a stop string in the
        answer's text (the generation then ends with this finish reason)."""
        return "repeated_call" if self.repeated else "stop" if self.stop_string else None

    def result(self) -> Reply:
        return Reply(self.text, tuple(self.calls), self.complete, tool_format=self._tool_format)

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._advance(out):
            pass
        return out

    def finish(self) -> list[Piece]:
        """At the reply's end (whatever ended it; streamed or not): the pieces still held — the
        answer's text held as a possible stop string, or a call cut short while it looked like a
        repeat. A call cut just before its closing brace, its arguments an earlier call's, is the
        repeat: dropped, as a whole one is."""
        out: list[Piece] = []
        self._release_text(out)
        held, self._held = self._held, []
        if held and self._repeats(self.calls[-1]):
            self._drop_repeat()
            return out
        return out + held

    def _drop_repeat(self) -> None:
        """The last call repeats an earlier one: the reply ends before it, complete."""
        self.calls.pop()
        self._held = []
        self.repeated = True
        self._state = "done"

    def _repeats(self, call: ToolCall) -> bool:
        return any(c.name == call.name and c.arguments == call.arguments for c in self.calls[:-1])

    def _call_piece(self, piece: Piece, out: list[Piece]) -> None:
        """A piece of the current call: passed on, or held while the call may repeat an earlier one."""
        call = self.calls[-1]
        if self._held or isinstance(piece, CallStart):
            may_repeat = any(c.name == call.name and c.arguments.startswith(call.arguments) for c in self.calls[:-1])
            if may_repeat:
                self._held.append(piece)
                return
            out.extend(self._held)
            self._held = []
        out.append(piece)

    def _end_call(self, out: list[Piece]) -> None:
        if self._held and self._repeats(self.calls[-1]):
            self._drop_repeat()
            return
        self._call_piece(CallEnd(len(self.calls) - 1), out)
        self._state = "next_call"

    def _advance(self, out: list[Piece]) -> bool:
        """One step of the reply's structure; False when it needs more text."""
        state, rest = self._state, self._buf[self._pos:]
        if state == "raw":
            if rest:
                self._emit_text(rest, out)
                self._pos = len(self._buf)
            return False
        if state == "start":
            for head, nxt in (('{"response":"', "text"), ('{"tool_calls":[', "call")):
                if rest.startswith(head):
                    self._pos += len(head)
                    self._state = nxt
                    return True
            return self._unexpected(rest, '{"response":"', '{"tool_calls":[')
        if state == "text":
            return self._response_text(rest, out)
        if state == "text_end":
            return self._expect(rest, "}", "done")
        if state == "call":
            return self._call_head(rest, out)
        if state == "arguments":
            return self._arguments(rest, out)
        if state == "call_end":
            if rest.startswith("}"):
                self._pos += 1
                self._end_call(out)
                return True
            return self._unexpected(rest, "}")
        if state == "next_call":
            if rest.startswith(","):
                self._pos += 1
                self._state = "call"
                return True
            return self._expect(rest, "]}", "done")
        return False  # done: nothing follows the object

    def _expect(self, rest: str, literal: str, then: str) -> bool:
        if rest.startswith(literal):
            self._pos += len(literal)
            self._state = then
            return True
        return self._unexpected(rest, literal)

    def _unexpected(self, rest: str, *allowed: str) -> bool:
        """Waits while `rest` may still become one of `allowed`; otherwise (not the grammar's
        reply: only a bug could do it) the rest is passed on as text."""
        if any(a.startswith(rest) for a in allowed):
            return False
        self._state = "raw"
        return True

    def _response_text(self, rest: str, out: list[Piece]) -> bool:
        decoded, i = [], 0
        while i < len(rest):
            ch = rest[i]
            if ch == '"':
                self._state = "text_end"
                break
            if ch != "\\":
                decoded.append(ch)
                i += 1
                continue
            m = _ESCAPE.match(rest, i)
            if m is None:  # an escape not whole yet
                break
            end = m.end()
            code = int(m.group(1)[1:], 16) if m.group(1)[0] == "u" else None
            if code is not None and 0xD800 <= code < 0xDC00:  # a surrogate pair: both halves at once
                low = _ESCAPE.match(rest, end)
                if low is None:
                    break
                end = low.end()
            decoded.append(json.loads(f'"{rest[i:end]}"'))
            i = end
        self._pos += i + (1 if self._state == "text_end" else 0)
        if decoded:
            self._emit_text("".join(decoded), out)
        if self._state == "text_end":  # the answer is over: what was held cannot become a stop string
            self._release_text(out)
        return self._state == "text_end"

    def _emit_text(self, text: str, out: list[Piece]) -> None:
        if not self._stop:
            self.text += text
            out.append(TextPiece(text))
            return
        whole = self.text + self._text_held + text
        cut = find_stop(whole, self._stop, len(self.text))
        if cut is not None:
            self._text_held = whole[len(self.text):cut[0]]
            self._release_text(out)
            self.stop_string, self._state = cut[1], "stopped"
            return
        keep = held_back(whole, self._stop)
        self._text_held = whole[len(self.text):]
        self._release_text(out, keep)

    def _release_text(self, out: list[Piece], keep: int = 0) -> None:
        """The held text but its last `keep` characters, passed on."""
        text = self._text_held[:len(self._text_held) - keep]
        self._text_held = self._text_held[len(text):]
        if text:
            self.text += text
            out.append(TextPiece(text))

    def _call_head(self, rest: str, out: list[Piece]) -> bool:
        head = '{"name":'
        if not rest.startswith(head):
            return self._unexpected(rest, head)
        try:
            name, end = json.JSONDecoder().raw_decode(rest, len(head))
        except json.JSONDecodeError:
            return False  # the name is not whole yet
        tail = ',"arguments":'
        if not rest.startswith(tail, end):
            return self._unexpected(rest[end:], tail)
        call = ToolCall(new_call_id(self._id_prefix), name, "")
        self.calls.append(call)
        self._call_piece(CallStart(len(self.calls) - 1, call.id, name), out)
        self._pos += end + len(tail)
        self._args_from = self._pos
        self._state = "arguments"
        return True

    def _arguments(self, rest: str, out: list[Piece]) -> bool:
        """The arguments object's text, passed on as it comes; it ends where its braces close."""
        n = 0
        for n, ch in enumerate(rest, 1):
            if self._in_string:
                self._escaped, self._in_string = (False, True) if self._escaped else (ch == "\\", ch != '"')
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._state = "call_end"
                    break
        else:
            n = len(rest)
        if n:
            self._pos += n
            call = self.calls[-1]
            self.calls[-1] = ToolCall(call.id, call.name, self._buf[self._args_from:self._pos])
            self._call_piece(ArgumentsPiece(len(self.calls) - 1, rest[:n]), out)
        return self._state == "call_end"
