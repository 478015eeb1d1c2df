"""llama.cpp's own parser cases (the pinned tree's tests/test-chat.cpp), read from its source as data:
each `tst.test("<model output>").tools({...})...expect(...).run();` chain of a `peg_tester` on a template
of models/templates/ becomes a Case (the template, the request fields, the output, the message llama.cpp's
test expects its parser to give). A chain this reader cannot take as data (an output built by code, a
continued message, a JSON Schema, an expectation it does not know) is left out, and counted."""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_REASONING = {"NONE": "none", "AUTO": "auto", "DEEPSEEK": "deepseek", "DEEPSEEK_LEGACY": "deepseek-legacy"}
_CHOICES = {"AUTO": "auto", "REQUIRED": "required", "NONE": "none"}


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # JSON text (llama.cpp's tests compare it re-serialized)
    id: str = ""


@dataclass(frozen=True)
class Message:
    content: str = ""
    reasoning: str = ""
    calls: tuple[Call, ...] = ()


@dataclass
class Case:
    line: int  # of the chain in test-chat.cpp
    template: str  # a file of models/templates/
    output: str  # the model's output
    request: dict[str, Any] = field(default_factory=dict)  # ChatTemplate.apply's fields but messages
    expect: Message = field(default_factory=Message)
    is_partial: bool = False

    @property
    def id(self) -> str:
        return f"{self.template.removesuffix('.jinja')}-line{self.line}"


class Unreadable(ValueError):
    """A piece of C++ that is not a literal this reader takes."""


def _literal_end(src: str, at: int) -> tuple[str, int]:
    """The C++ string literal at `at` (ordinary or raw), and where it ends."""
    raw = re.match(r'R"([^(\s]*)\(', src[at:])
    if raw:
        close = ")" + raw.group(1) + '"'
        end = src.index(close, at + raw.end())
        return src[at + raw.end():end], end + len(close)
    if src[at] != '"':
        raise Unreadable(src[at:at + 40])
    out, i = [], at + 1
    escapes = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}
    while src[i] != '"':
        if src[i] == "\\":
            if src[i + 1] in escapes:
                out.append(escapes[src[i + 1]])
                i += 2
                continue
            code = re.match(r"x([0-9a-fA-F]+)|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})", src[i + 1:i + 12])
            if not code:
                raise Unreadable(src[i:i + 6])
            out.append(chr(int(next(g for g in code.groups() if g), 16)))
            i += 1 + code.end()
            continue
        out.append(src[i])
        i += 1
    return "".join(out), i + 1


_SPACE = re.compile(r"(\s|//[^\n]*\n|/\*.*?\*/)*", re.S)


def strings(expr: str, variables: dict[str, str] | None = None) -> str:
    """String literals, adjacent or joined by `+`, and `variables` (string constants) among them, as one
    string (the only expression taken)."""
    at, parts = _SPACE.match(expr).end(), []
    while at < len(expr):
        name = re.compile(r"\w+").match(expr, at)
        if expr[at] == "+" and parts:
            at += 1
        elif name and not expr.startswith('R"', at):
            if name.group() not in (variables or {}):
                raise Unreadable(expr)
            parts.append(variables[name.group()])
            at = name.end()
        else:
            text, at = _literal_end(expr, at)
            parts.append(text)
        at = _SPACE.match(expr, at).end()
    if not parts:
        raise Unreadable(expr)
    return "".join(parts)


def _brackets(src: str, at: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, character, bracket depth after it) of `src` from `at`, string literals skipped."""
    depth, i = 0, at
    while i < len(src):
        ch = src[i]
        if ch == '"' or (ch == "R" and src.startswith('R"', i)):
            i = _literal_end(src, i)[1]
            continue
        depth += (ch in "({[") - (ch in ")}]")
        yield i, ch, depth
        i += 1


def _split_args(expr: str) -> list[str]:
    """Top-level comma-separated pieces of `expr` (brackets and string literals respected)."""
    pieces, start = [], 0
    for i, ch, depth in _brackets(expr):
        if ch == "," and depth == 0:
            pieces.append(expr[start:i])
            start = i + 1
    last = expr[start:]
    return [p.strip() for p in pieces + ([last] if last.strip() else [])]


def _balanced(src: str, at: int) -> int:
    """The index past the bracket closing the one at `at`."""
    return next(i + 1 for i, ch, depth in _brackets(src, at) if ch in ")}]" and depth == 0)


def _strip_comments(src: str) -> str:
    """Comments blanked out (string literals kept), so that line numbers stay."""
    out, i = [], 0
    while i < len(src):
        if src[i] == '"' or (src[i] == "R" and src.startswith('R"', i) and not src[i - 1].isalnum()):
            end = _literal_end(src, i)[1]
            out.append(src[i:end])
            i = end
        elif src.startswith("//", i):
            end = src.find("\n", i)
            out.append(" " * (end - i))
            i = end
        elif src.startswith("/*", i):
            end = src.index("*/", i) + 2
            out.append(re.sub(r"[^\n]", " ", src[i:end]))
            i = end
        elif src[i] == "'":  # a char literal ('"' would open a string otherwise)
            end = src.index("'", i + 2 if src[i + 1] == "\\" else i + 1) + 1
            out.append(src[i:end])
            i = end
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def _tools(src: str) -> dict[str, dict[str, Any]]:
    """`common_chat_tool NAME{ "name", "description", R"(parameters)" }` definitions, OpenAI's shape."""
    tools = {}
    for m in re.finditer(r"common_chat_tool\s+(\w+)\s*\{", src):
        try:
            body = src[m.end():_balanced(src, m.end() - 1) - 1]
            name, description, parameters = (strings(a) for a in _split_args(body))
            tools[m.group(1)] = {"type": "function", "function": {
                "name": name, "description": description, "parameters": json.loads(parameters)}}
        except (Unreadable, ValueError):
            continue
    return tools


def _message(expr: str, messages: dict[str, Message]) -> Message:
    """A message expression: a known name, or simple_assist_msg / message_with_* with literal arguments."""
    expr = expr.strip()
    if re.fullmatch(r"\w+", expr):
        if expr not in messages:
            raise Unreadable(expr)
        return messages[expr]
    m = re.match(r"(\w+)\s*\(", expr)
    if not m or _balanced(expr, m.end() - 1) != len(expr):
        raise Unreadable(expr)
    args = _split_args(expr[m.end():-1])
    kind = m.group(1)
    if kind == "simple_assist_msg":
        content, reasoning, name, arguments, call_id = ([strings(a) for a in args] + [""] * 5)[:5]
        return Message(content, reasoning, (Call(name, arguments, call_id),) if name or call_id else ())
    if kind == "message_with_tool_calls":
        return Message(calls=(Call(strings(args[0]), strings(args[1])),))
    if kind == "message_with_tool_calls_and_reasoning":
        return Message(reasoning=strings(args[2]), calls=(Call(strings(args[0]), strings(args[1])),))
    if kind == "message_with_reasoning_and_tool_call":
        return Message(reasoning=strings(args[0]), calls=(Call(strings(args[1]), strings(args[2])),))
    if kind == "message_with_content_and_tool_call":
        return Message(strings(args[0]), calls=(Call(strings(args[1]), strings(args[2])),))
    if kind == "message_with_reasoning_content_and_multiple_tool_calls":
        return Message(strings(args[1]), strings(args[0]), _calls(args[2]))
    raise Unreadable(kind)


def _calls(expr: str) -> tuple[Call, ...]:
    """expect_tool_calls' `{ { "name", R"(args)", "id" or {} }, ... }`."""
    expr = expr.strip()
    if not (expr.startswith("{") and expr.endswith("}")):
        raise Unreadable(expr)
    calls = []
    for item in _split_args(expr[1:-1]):
        parts = _split_args(item.strip()[1:-1])
        call_id = "" if len(parts) < 3 or parts[2] in ("{}", '""') else strings(parts[2])
        calls.append(Call(strings(parts[0]), strings(parts[1]), call_id))
    return tuple(calls)


def _bool(expr: str) -> bool:
    if expr not in ("true", "false"):
        raise Unreadable(expr)
    return expr == "true"


def read_cases(test_chat_cpp: Path) -> tuple[list[Case], Counter[str]]:
    """The cases of test-chat.cpp this reader takes, and why the others were left out (a count per reason)."""
    src = _strip_comments(test_chat_cpp.read_text())
    tools = _tools(src)
    messages: dict[str, Message] = {}
    texts: dict[str, str] = {}  # string constants (outputs built of them)
    testers: dict[str, list[str]] = {}  # a peg_tester variable -> its template(s)
    loop_paths: list[str] = []
    # a tester made in a function from its argument: the templates of the loops that call it
    by_function: dict[str, list[str]] = {}
    for m in re.finditer(r"for\s*\(\s*const\s+(?:auto\s*&|char\s*\*)\s*(\w+)\s*:\s*\{", src):
        end = _balanced(src, m.end() - 1)
        call = re.compile(r"\s*\)\s*\{\s*(\w+)\(\s*" + m.group(1) + r"\b").match(src, end)
        if call:
            by_function[call.group(1)] = [strings(a) for a in _split_args(src[m.end():end - 1])]
    cases: list[Case] = []
    left_out: Counter[str] = Counter()
    pattern = re.compile(
        r"(?P<msg>(?:const\s+common_chat_msg|auto)\s+(?P<msg_name>\w+)\s*=\s*"
        r"(?=(?:simple_assist_msg|message_with_\w+)\s*\())"
        r"|(?P<text>const\s+std::string\s+(?P<text_name>\w+)\s*=)"
        r"|(?P<loop>for\s*\(\s*const\s+(?:auto\s*&|char\s*\*)\s*path\s*:\s*\{)"
        r"|(?P<tester>auto\s+(?P<var>\w+)\s*=\s*peg_tester(?=\())"
        r"|(?P<test>\b(?P<tvar>\w+)\.test\()")
    for m in pattern.finditer(src):
        if m.group("msg"):
            end = _balanced(src, src.index("(", m.end()))
            try:
                messages[m.group("msg_name")] = _message(src[m.end():end], messages)
            except Unreadable:
                pass
        elif m.group("text"):
            end = src.find(";", m.end())
            try:
                texts[m.group("text_name")] = strings(src[m.end():end], texts)
            except (Unreadable, ValueError):
                pass
        elif m.group("loop"):
            end = _balanced(src, m.end() - 1)
            loop_paths = [strings(a) for a in _split_args(src[m.end():end - 1])]
        elif m.group("tester"):
            arg = _split_args(src[m.end() + 1:_balanced(src, m.end()) - 1])[0]
            functions = re.findall(r"\bstatic\s+void\s+(\w+)\s*\(", src[:m.start()])
            paths = (loop_paths if arg == "path" else [strings(arg)] if arg.startswith('"') else
                     by_function.get(functions[-1], []) if functions else [])
            testers[m.group("var")] = [Path(p).name for p in paths]
        elif m.group("test"):
            line = src.count("\n", 0, m.start()) + 1
            templates = testers.get(m.group("tvar"), [])
            try:
                chain = _chain(src, m.end() - 1)
            except Unreadable:
                left_out["a chain this reader cannot follow"] += 1
                continue
            if not templates:
                left_out["a tester whose template is not a literal"] += 1
                continue
            try:
                for template in templates:
                    cases.append(_case(line, template, chain, tools, messages, texts))
            except Unreadable as exc:
                left_out[str(exc.args[0]).split("(")[0][:60]] += 1
    return cases, left_out


def _chain(src: str, at: int) -> list[tuple[str, str]]:
    """`.test(...).name(args)...run()` from the bracket at `at`: (method, argument text) pairs."""
    end = _balanced(src, at)
    chain = [("test", src[at + 1:end - 1])]
    while True:
        m = re.compile(r"\s*\.\s*(\w+)\s*\(").match(src, end)
        if not m:
            raise Unreadable("chain")
        close = _balanced(src, m.end() - 1)
        chain.append((m.group(1), src[m.end():close - 1]))
        end = close
        if m.group(1) == "run":
            return chain


def _case(line: int, template: str, chain: list[tuple[str, str]], tools: dict[str, dict[str, Any]],
          messages: dict[str, Message], texts: dict[str, str]) -> Case:
    case = Case(line, template, strings(chain[0][1], texts), {"reasoning_format": "none", "parallel_tool_calls": False})
    expect = Message()
    for method, arg in chain[1:]:
        arg = arg.strip()
        if method == "tools":
            names = [a for a in _split_args(arg.strip("{} \n"))]
            if not all(n in tools for n in names):
                raise Unreadable("tools")
            case.request["tools"] = [tools[n] for n in names]
        elif method == "enable_thinking":
            case.request["enable_thinking"] = _bool(arg)
        elif method == "parallel_tool_calls":
            case.request["parallel_tool_calls"] = _bool(arg)
        elif method == "reasoning_format":
            case.request["reasoning_format"] = _REASONING[arg.removeprefix("COMMON_REASONING_FORMAT_")]
        elif method == "tool_choice":
            case.request["tool_choice"] = _CHOICES[arg.removeprefix("COMMON_CHAT_TOOL_CHOICE_")]
        elif method == "is_partial":
            case.is_partial = _bool(arg)
        elif method == "expect":
            expect = _message(arg, messages)
        elif method == "expect_content":
            expect = Message(strings(arg), expect.reasoning, expect.calls)
        elif method == "expect_reasoning":
            expect = Message(expect.content, strings(arg), expect.calls)
        elif method == "expect_tool_calls":
            expect = Message(expect.content, expect.reasoning, _calls(arg))
        elif method in ("expect_reconstruction", "run"):
            pass
        else:  # messages, continue_final_message, add_generation_prompt, json_schema: not a reply to a user
            raise Unreadable(method)
    case.expect = expect
    return case
