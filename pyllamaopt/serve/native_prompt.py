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
        if turn.calls:
            messages.append({"role": "assistant", "content": turn.text or None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.sent or c.arguments}}
                for c in turn.calls]})
        elif turn.text or not turn.results:
            messages.append({"role": turn.role, "content": turn.text})
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
                  generation_prompt: str) -> tuple[str | None, tuple[Trigger, ...]]:
    """llama.cpp's grammar of a reply for the engine's grammar, and its triggers if it is lazy (as
    llama.cpp applies a format's call grammar with tool_choice "auto": from the format's opening
    tag on; RenderedChat.grammar_triggers as Session.generate takes them). A lazy grammar's root is
    the calls alone. Otherwise llama.cpp's root rule starts with the generation prompt (the end of
    the prompt, "<|im_start|>assistant\\n"), which its sampler feeds the grammar before the reply;
    the engine's grammar starts at the reply, so that leading literal is taken out of the root rule.
    A root that does not start so is used as it is unless it names the generation prompt elsewhere
    (then None: the reply is free, and parsed)."""
    if not grammar:
        return None, ()
    if lazy:
        return grammar, tuple((kind, token if kind == "token" else value) for kind, value, token in triggers)
    root = re.search(r"^root ::= (.*)$", grammar, re.MULTILINE)
    literal = '"' + "".join(_GBNF_ESCAPES.get(ch, ch) for ch in generation_prompt) + '"'
    if root is None or not generation_prompt:
        return grammar, ()
    if root.group(1).startswith(literal + " "):
        start = root.start(1)
        return grammar[:start] + grammar[start + len(literal) + 1:], ()
    return (None if literal in root.group(1) else grammar), ()


_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
