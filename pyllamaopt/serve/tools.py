"""Tool calling for the chat routes (OpenAI and Anthropic share it; each converts its own shapes).

Neither of our models' templates knows tools, so calls go through a *generic format* (as
llama.cpp's `llama-server` does for such templates; docs/serve.md):

- the system message gets the tool definitions and an instruction (``system_text``);
- the reply is grammar-constrained JSON, compact, keys in this order, one of
      {"tool_calls":[{"name":"<tool>","arguments":{...}}, ...]}
      {"response":"<text for the user>"}
  (``reply_schema``: tool_choice picks the alternatives, parallel_tool_calls caps the list at 1);
- the history renders as the exact text the model produced: an assistant's calls as the first
  form (their arguments as the client sent them back: ours, verbatim), an assistant's text as
  the second (when the request has tools), tool results as a user message
      {"tool_results":[{"name":"<tool>","content":"<result>"}, ...]}
  so that the next request's prompt starts with the previous prompt and reply, and the
  previous prompt's KV is reused.

A template that renders ``tools=`` itself gets the definitions that way; the reply and the
history keep the generic format (we parse no model-specific call syntax).
"""
from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..chat import ChatTemplate, Message, token_spans
from ..chat import prompt_tokens as chat_prompt_tokens
from ..errors import ChatTemplateError, GrammarError, InvalidArgumentError
from ..grammar import json_schema_to_gbnf
from ..model import Model
from ..stop_strings import find_stop, held_back, stop_list
from .service import BadRequest, GenerateParams

INSTRUCTION = (
    'Reply with one JSON object and nothing else: {"tool_calls":[{"name":"...","arguments":{...}}]} to call '
    'one or more of the tools, or {"response":"..."} to answer the user. Tool results come back as '
    '{"tool_results":[{"name":"...","content":"..."}]}.')


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


@dataclass(frozen=True)
class Prompt:
    text: str
    generic: bool  # the reply is in the generic format (parse it with ReplyParser)
    # with mark_tool_results: the [start, end) characters of each tool result's content in `text`
    tool_results: list[tuple[int, int]] = field(default_factory=list)
    # how `text` was rendered: its messages' contents are tokenized as text (chat.prompt_tokens)
    template: ChatTemplate | None = None
    messages: list[Message] = field(default_factory=list)
    render_args: dict[str, Any] = field(default_factory=dict)
    # generic: the request's stop strings, for the answer's decoded text (ReplyParser), not the JSON's
    stop: list[str] = field(default_factory=list)


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


# the prompt

def prompt(template: ChatTemplate, turns: Sequence[Turn], tools: Sequence[Tool], choice: ToolChoice,
           params: GenerateParams, *, mark_tool_results: bool = False, continue_last: bool = False) -> Prompt:
    """The rendered prompt; with tools, `params` gets the reply's grammar; with
    `mark_tool_results`, where the tool results' contents are in it (for sparse attention over
    tool results); with `continue_last`, a last assistant turn is continued (Anthropic's prefill:
    its text ends the prompt, no new turn opened). Every error is a BadRequest."""
    _check_tools(tools)
    prefill = _prefill(turns) if continue_last else None
    if prefill is not None and tools:
        raise BadRequest("a last assistant message (a prefill to continue) cannot be combined with tools: the "
                         "reply's format is the tool-calling one; send the request without it")
    generic = bool(tools)
    if generic:
        if params.json_schema is not None or params.grammar is not None:
            raise BadRequest("response_format cannot be combined with tools: the reply's format is the tool-calling "
                             "one (docs/serve.md); describe the answer's shape as a tool's parameters instead")
        params.grammar = reply_grammar(tools, choice)
        try:  # (given to the engine, they would match the JSON's text: a call's, escapes)
            stop, params.stop = stop_list(params.stop), []
        except InvalidArgumentError as exc:
            raise BadRequest(str(exc)) from None
        params.until = ReplyWatch(stop)
    else:
        _check_choice_without_tools(choice)
    native = generic and template.takes_tools
    messages, results = _messages(turns, generic)
    if generic:
        system = INSTRUCTION if native else system_text(tools)
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + system}
        else:
            messages.insert(0, {"role": "system", "content": system})
            results.insert(0, [])
    extra: dict[str, Any] = {"tools": [{"type": "function", "function": _definition(t)} for t in tools]} if native else {}
    if prefill == "":  # nothing to continue: the reply is a new turn
        messages, results = messages[:-1], results[:-1]
    elif prefill:  # rendered with a mark after it, to find where it ends (not inside the end of its turn)
        messages[-1] = {**messages[-1], "content": prefill + _PREFILL_END}
    marked: list[tuple[int, int]] = []
    render_args = {"add_generation_prompt": not prefill, **extra}
    try:
        if mark_tool_results:
            text, marked = template.render_marked(messages, dict(enumerate(results)), **render_args)
        else:
            text = template.render(messages, **render_args)
    except ChatTemplateError as exc:
        raise BadRequest(str(exc)) from None
    if prefill:
        end = text.find(_PREFILL_END)
        if end < 0 or not text[:end].endswith(prefill):
            raise BadRequest("the chat template changes the last assistant message's text, so the reply cannot "
                             "continue it; send the request without it")
        text = text[:end]  # what the template puts after the turn (its end) is left out
        marked = [(a, b) for a, b in marked if b <= len(text)]
    return Prompt(text, generic, marked, template, messages, render_args, stop if generic else [])


_PREFILL_END = "\u2063pyllamaopt-prefill-end\u2063"  # (U+2063: text no message has, kept by any template)


def _prefill(turns: Sequence[Turn]) -> str | None:
    """The text of a last assistant turn to continue ("" if it has none), else None."""
    if not turns or turns[-1].role != "assistant":
        return None
    last = turns[-1]
    if last.calls:
        raise BadRequest("the last message is an assistant's tool call: send its result (a user message with a "
                         "tool_result block) to continue")
    if last.text != last.text.rstrip():
        raise BadRequest("final assistant content cannot end with trailing whitespace")  # (as Anthropic's API)
    return last.text


async def render(template: ChatTemplate, model: Model, turns: Sequence[Turn], tools: Sequence[Tool],
                 choice: ToolChoice, params: GenerateParams, *, mark_tool_results: bool = False,
                 continue_last: bool = False) -> tuple[Prompt, list[int], list[tuple[int, int]]]:
    """`prompt` and `prompt_tokens`, off the event loop: a long history takes tens of milliseconds
    to render and tokenize, during which other connections' streams would stall."""
    def work() -> tuple[Prompt, list[int], list[tuple[int, int]]]:
        rendered = prompt(template, turns, tools, choice, params, mark_tool_results=mark_tool_results,
                          continue_last=continue_last)
        return (rendered, *prompt_tokens(model, rendered))

    return await asyncio.to_thread(work)


def prompt_tokens(model: Model, prompt: Prompt) -> tuple[list[int], list[tuple[int, int]]]:
    """The prompt's tokens, and the token ranges of its tool results' contents (if marked)."""
    try:
        tokens = (chat_prompt_tokens(model, prompt.template, prompt.messages, prompt.text, **prompt.render_args)
                  if prompt.template else model.tokenize(prompt.text, add_bos=False, special=True))
    except ChatTemplateError as exc:
        raise BadRequest(str(exc)) from None
    return tokens, token_spans(model, prompt.text, tokens, prompt.tool_results) if prompt.tool_results else []


def system_text(tools: Sequence[Tool]) -> str:
    lines = "\n".join(compact(_definition(t)) for t in tools)
    return f"You can call these tools (name, description, JSON Schema of the arguments):\n{lines}\n\n{INSTRUCTION}"


def _definition(tool: Tool) -> dict[str, Any]:
    d: dict[str, Any] = {"name": tool.name}
    if tool.description:
        d["description"] = tool.description
    d["parameters"] = tool.parameters
    return d


def _check_tools(tools: Sequence[Tool]) -> None:
    seen: set[str] = set()
    for i, t in enumerate(tools):
        if not t.name:
            raise BadRequest(f"tools[{i}]: a tool needs a non-empty 'name'")
        if t.name in seen:
            raise BadRequest(f"tools[{i}]: two tools are named {t.name!r}")
        seen.add(t.name)
        kind = t.parameters.get("type", "object")
        if kind != "object":
            raise BadRequest(f"tools[{i}] ({t.name}): the parameters must be an object schema "
                             f"(type 'object'), got type {kind!r}")


def _check_choice_without_tools(choice: ToolChoice) -> None:
    if choice.name is not None:
        raise BadRequest(f"tool_choice names the function {choice.name!r}, but the request has no tools")
    if choice.mode == "required":
        raise BadRequest("tool_choice requires a tool call, but the request has no tools")


def _messages(turns: Sequence[Turn], generic: bool) -> tuple[list[Message], list[list[tuple[int, int]]]]:
    """The turns as the template's messages: calls, results and (with tools) text answers in the
    generic format; results merged with the user message that follows them. And for each
    message, the [start, end) characters of its tool results' contents in its content."""
    names: dict[str, str] = {}  # call id -> function name, of every call so far
    merged: list[Turn] = []
    for i, turn in enumerate(turns):
        for c in turn.calls:
            names[c.id] = c.name
        for r in turn.results:
            if r.call_id not in names:
                raise BadRequest(f"messages[{i}]: a tool result for call {r.call_id!r}, but no earlier assistant "
                                 "message made that call")
        last = merged[-1] if merged else None
        if last is not None and last.role == "user" == turn.role and last.results and not last.text:
            last.results = last.results + turn.results
            last.text = turn.text
        else:
            merged.append(Turn(turn.role, turn.text, list(turn.calls), list(turn.results)))
    contents = [_content(t, names, generic) for t in merged]
    return [{"role": t.role, "content": c} for t, (c, _) in zip(merged, contents)], [r for _, r in contents]


def _content(turn: Turn, names: dict[str, str], generic: bool) -> tuple[str, list[tuple[int, int]]]:
    """A message's content, and where its tool results' contents are in it (inside their JSON
    strings' quotes)."""
    if turn.calls:
        calls = ",".join(f'{{"name":{compact(c.name)},"arguments":{c.arguments}}}' for c in turn.calls)
        return (turn.text + "\n" if turn.text else "") + f'{{"tool_calls":[{calls}]}}', []
    if turn.results:
        text, spans = '{"tool_results":[', []
        for k, r in enumerate(turn.results):
            name = names[r.call_id]
            head = ("," if k else "") + f'{{"name":{compact(name)},"content":'
            content = compact(r.content)
            spans.append((len(text) + len(head) + 1, len(text) + len(head) + len(content) - 1))
            text += head + content + (',"is_error":true' if r.is_error else "") + "}"
        return text + "]}" + ("\n\n" + turn.text if turn.text else ""), spans
    if generic and turn.role == "assistant":
        return compact({"response": turn.text}), []
    return turn.text, []


# the reply's grammar

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


# the reply, parsed as it streams

class ReplyWatch:
    """``GenerateParams.until`` for a generic reply: fed each token's text, it says when the reply
    ends before its JSON does — a repeated call ("repeated_call") or a stop string in the answer's
    text ("stop", ``stop_string``) — so that the generation ends there (ReplyParser decides)."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._parser = ReplyParser(True, "", stop)

    @property
    def stop_string(self) -> str | None:
        return self._parser.stop_string

    def __call__(self, text: str) -> str | None:
        self._parser.feed(text)
        return "repeated_call" if self._parser.repeated else "stop" if self.stop_string else None


@dataclass(frozen=True)
class TextPiece:
    text: str


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


Piece = TextPiece | CallStart | ArgumentsPiece | CallEnd

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

    def __init__(self, generic: bool, id_prefix: str, stop: Sequence[str] = ()) -> None:
        self._id_prefix = id_prefix
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
