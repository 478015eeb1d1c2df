"""A chat request with tools in the model's own format: for a template that renders tools and calls
itself (``ChatTemplate.takes_tools``: Qwen2.5's, Llama 3.1's, Hermes', Mistral's, ...), the turns
go to llama.cpp's chat layer as llama-server gives them to it (OpenAI's messages: an assistant's
``tool_calls``, a ``tool`` message per result), and the reply is read by that layer's parser for
the template's format (native_reply.py). Other templates keep the generic format (chat_prompt.py).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..chat import Message
from .chat_messages import NO_PARAMETERS, Tool, ToolChoice, Turn


def native_messages(turns: Sequence[Turn]) -> tuple[list[Message], dict[int, list[tuple[int, int]]]]:
    """The turns as OpenAI's messages, and for each tool message the [start, end) characters of its
    result in its content (the whole content)."""
    messages: list[Message] = []
    results: dict[int, list[tuple[int, int]]] = {}
    for turn in turns:
        for r in turn.results:
            results[len(messages)] = [(0, len(r.content))]
            messages.append({"role": "tool", "tool_call_id": r.call_id, "content": r.content})
        reasoning = {"reasoning_content": turn.reasoning} if turn.reasoning else {}
        if turn.calls:
            messages.append({"role": "assistant", "content": turn.text or None, **reasoning, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.sent or c.arguments}}
                for c in turn.calls]})
        elif turn.text or turn.reasoning or not turn.results:
            messages.append({"role": turn.role, "content": turn.text, **reasoning})
    return messages, results


def native_render_args(tools: Sequence[Tool], choice: ToolChoice, add_generation_prompt: bool) -> dict[str, Any]:
    """ChatTemplate.render's arguments for the tools offered. llama.cpp's chat layer knows no named
    tool choice: a named function is offered alone, its call required. Parallel calls unless refused:
    as the template supports them (llama-server's default)."""
    offered = [t for t in tools if choice.name in (None, t.name)]
    return {"add_generation_prompt": add_generation_prompt, "tools": [_definition(t) for t in offered],
            "tool_choice": choice.mode, "parallel_tool_calls": None if choice.parallel else False}


def _definition(tool: Tool) -> dict[str, Any]:
    # (as the request gave it: a tool without parameters has {} in llama-server's rendering too)
    parameters = {} if tool.parameters is NO_PARAMETERS else tool.parameters
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": parameters}}


Trigger = tuple[str, str | int]  # Session.generate's grammar_triggers: (kind, value)


def reply_grammar(grammar: str, lazy: bool, triggers: Sequence[tuple[str, str, int]],
                  generation_prompt: str, parallel: bool) -> tuple[str | None, tuple[Trigger, ...]]:
    """llama.cpp's grammar of a reply for the engine's grammar, and its triggers if it is lazy (as
    llama.cpp applies a format's call grammar with tool_choice "auto": from the format's opening
    tag on; RenderedChat.grammar_triggers as Session.generate takes them). A lazy grammar's root is
    the calls alone. Otherwise (a call required) llama.cpp's root rule starts with the generation
    prompt (the end of the prompt, "<|im_start|>assistant\\n"), which its sampler feeds the grammar
    before the reply; a root whose first item is that literal has it taken out (the engine's grammar
    then starts at the reply); any other root is kept whole, and the engine's grammar takes the
    generation prompt first as llama.cpp's does (grammar_prefill: a generation prompt that opens the
    reply's thinking, "...assistant\\n<think>\\n", leaves the grammar inside its reasoning rule).

    Two changes to the pinned tree's grammars, which only narrow what they allow:
    - with a call required, its root lets text come before the calls (``until-N?``: any text up to
      the format's opening tag), so a model that writes a call without its format's tags (Qwen2.5-Coder
      0.5B writes bare JSON) writes text to max_tokens and never calls; that text is taken out, and
      the reply opens with a call in the format's syntax (as llama.cpp's per-format handlers before
      its automatic parser had it, and OpenAI's "required" means);
    - with parallel_tool_calls false, its per-call JSON formats (Hermes' ``<tool_call>`` repeated)
      still repeat the call (``tool-calls ::= (tool-call space)+``): one call.
    A root of another shape (alternatives at its top, no text before the calls) is left as it is."""
    if not grammar:
        return None, ()
    if not parallel:
        grammar = _REPEATED_CALLS.sub(r"\1\2 space", grammar)
    if lazy:
        return grammar, tuple((kind, token if kind == "token" else value) for kind, value, token in triggers)
    root = re.search(r"^root ::= (.*)$", grammar, re.MULTILINE)
    if root is None:
        return grammar, ()
    body = root.group(1)
    if _root_opens_with(body, generation_prompt):
        body = body[len(_gbnf_literal(generation_prompt)) + 1:]
    return grammar[:root.start(1)] + _calls_first(body) + grammar[root.end(1):], ()


def grammar_prefill(grammar: str, lazy: bool, generation_prompt: str) -> str:
    """What the engine's grammar of the reply (reply_grammar) takes before the reply, as llama.cpp's
    sampler feeds a tool-call grammar applied from the reply's start the generation prompt's tokens
    (common/sampling.cpp, common_grammar_needs_prefill): the generation prompt, unless reply_grammar
    took it out of the root rule (then nothing); a lazy grammar takes nothing."""
    root = re.search(r"^root ::= (.*)$", grammar, re.MULTILINE)
    if not grammar or lazy or root is None or _root_opens_with(root.group(1), generation_prompt):
        return ""
    return generation_prompt


def _root_opens_with(body: str, generation_prompt: str) -> bool:
    return bool(generation_prompt) and body.startswith(_gbnf_literal(generation_prompt) + " ")


def _gbnf_literal(text: str) -> str:
    return '"' + "".join(_GBNF_ESCAPES.get(ch, ch) for ch in text) + '"'


# llama.cpp's names: the text before a format's calls (common_peg's until parser), the calls repeated
_TEXT_BEFORE_CALLS = re.compile(r"until-\d+\??")
_RULE_NAME = re.compile(r"[A-Za-z0-9-]+")
_REPEATED_CALLS = re.compile(r"^(tool-calls ::= )\((tool-call\??) space\)\+$", re.MULTILINE)


def _calls_first(root: str) -> str:
    """A required call's root rule without the text before the calls: the item before its last (the
    calls' rule), past any ``space``, if that item is text up to the format's opening tag."""
    items = _top_level_items(root)
    if not items or not _RULE_NAME.fullmatch(items[-1]):
        return root
    k = len(items) - 2
    while k >= 0 and items[k] == "space":
        k -= 1
    if k < 0 or not _TEXT_BEFORE_CALLS.fullmatch(items[k]):
        return root
    return " ".join(items[:k] + items[k + 1:])


def _top_level_items(body: str) -> list[str] | None:
    """The items of a GBNF rule's body (a literal, a class, a group, a name, with its repetition mark),
    None if it has alternatives at its top level."""
    items: list[str] = []
    item, depth, i = "", 0, 0
    while i < len(body):
        ch = body[i]
        if ch in '"[':  # a literal or a class, up to its unescaped end
            close, j = ('"' if ch == '"' else "]"), i + 1
            while body[j] != close:
                j += 2 if body[j] == "\\" else 1
            item, i = item + body[i:j + 1], j + 1
            continue
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and ch == "|":
            return None
        if depth == 0 and ch == " ":
            if item:
                items.append(item)
            item = ""
        else:
            item += ch
        i += 1
    return [*items, item] if item else items


_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
