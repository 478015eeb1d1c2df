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
                  generation_prompt: str, parallel: bool, thinking: Sequence[str] = (),
                  ) -> tuple[str | None, tuple[Trigger, ...]]:
    """llama.cpp's grammar of a reply for the engine's grammar (narrowed: ``narrowed_grammar``), and
    its triggers if it is lazy (as llama.cpp applies a format's call grammar with tool_choice "auto":
    from the format's opening tag on; RenderedChat.grammar_triggers as Session.generate takes them). A
    lazy grammar's root is the calls alone. Otherwise (a call required) llama.cpp's root rule starts
    with the generation prompt (the end of the prompt, "<|im_start|>assistant\\n"), which its sampler
    feeds the grammar before the reply; a root whose first item is that literal has it taken out (the
    engine's grammar then starts at the reply); any other root is kept whole, and the engine's grammar
    takes the generation prompt first as llama.cpp's does (grammar_prefill: a generation prompt that
    opens the reply's thinking, "...assistant\\n<think>\\n", leaves the grammar inside its reasoning
    rule). `thinking`: the format's thinking tags (RenderedChat's thinking_start_tag and
    thinking_end_tags)."""
    if not grammar:
        return None, ()
    grammar = narrowed_grammar(grammar, not lazy, parallel, thinking)
    if lazy:
        return grammar, tuple((kind, token if kind == "token" else value) for kind, value, token in triggers)
    root = re.search(r"^root ::= (.*)$", grammar, re.MULTILINE)
    if root is None:
        return grammar, ()
    body = root.group(1)
    if _root_opens_with(body, generation_prompt):
        body = body[len(_gbnf_literal(generation_prompt)) + 1:]
    return grammar[:root.start(1)] + body + grammar[root.end(1):], ()


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


def narrowed_grammar(grammar: str, required: bool, parallel: bool, thinking: Sequence[str] = ()) -> str:
    """llama.cpp's grammar of a reply (its root starting with the generation prompt, as llama.cpp
    builds it) with two changes that only narrow what it allows:
    - `required` (a call required, the grammar applied from the reply's first token): the pinned
      tree's roots let free text come before the calls — text up to the format's opening tag
      (``until-N?``: the automatic parser's, Ling 3's), a response section (Command R7B's
      ``<|START_RESPONSE|>...<|END_RESPONSE|>``, Command R+'s, Kimi K3's ``<|open|>response<|sep|>``),
      text in one of the root's alternatives (Functionary v3.2's ``>>>all\\n``, DeepSeek V3.2's after
      its thinking) — so a model that writes a call without its format's tags (Qwen2.5-Coder 0.5B
      writes bare JSON) writes text to max_tokens and never calls; that text is taken out, and the
      reply opens with a call in the format's syntax, after its reasoning if any (a block that one of
      the format's `thinking` tags opens, closes or follows is kept; where the response section's
      opener was the parser's way out of a reasoning left open, Kimi K3's, the reasoning's end tag is
      required), as OpenAI's "required" means. Text after the calls (Ling 3's) goes too;
    - not `parallel`: formats that repeat the call whatever parallel_tool_calls says (Hermes'
      ``tool-calls ::= (tool-call space)+``; Kimi K3's and Functionary v3.2's choice of tools repeated)
      allow one call.
    A root of another shape is left as it is (docs/serve.md's format table)."""
    if not parallel:
        grammar = _REPEATED_CALLS.sub(r"\1\2 space", grammar)
        grammar = _REPEATED_CHOICE.sub(r"\1\2", grammar)
    root = re.search(r"^root ::= (.*)$", grammar, re.MULTILINE) if required else None
    items = _top_level_items(root.group(1)) if root else None
    if root is None or items is None:
        return grammar
    kept, calls = _calls_only(items, thinking, nested=False)
    grammar = grammar[:root.start(1)] + " ".join(kept) + grammar[root.end(1):]
    rule = re.search(rf"^{re.escape(calls)} ::= (.*)$", grammar, re.MULTILINE) if calls else None
    rule_items = _top_level_items(rule.group(1)) if rule else None
    if rule is None or not rule_items:
        return grammar
    return grammar[:rule.start(1)] + " ".join(_without_trailing_text(rule_items)) + grammar[rule.end(1):]


# llama.cpp's names: text up to a delimiter (common_peg's until parser), the calls repeated
_TEXT = re.compile(r"until-\d+\??")
_RULE_NAME = re.compile(r"[A-Za-z0-9-]+")
_REPEATED_CALLS = re.compile(r"^(tool-calls ::= )\((tool-call\??) space\)\+$", re.MULTILINE)
_REPEATED_CHOICE = re.compile(  # a choice of tools repeated, in the calls' rule (`tools`, `<format>-tool-call`)
    r"^((?:tools|[A-Za-z0-9-]+-tool-call) ::= (?:[^(\n]*? )?)(\([A-Za-z0-9-]+(?: \| [A-Za-z0-9-]+)*\)|[A-Za-z0-9-]+)\+",
    re.MULTILINE)


def _calls_only(items: list[str], thinking: Sequence[str], nested: bool) -> tuple[list[str], str | None]:
    """A sequence's items (a root's, or an alternative's of a group in it: nested) without the free
    text before and after its calls, and the name of the calls' rule. The calls: the last item naming
    a rule, or a group of alternatives (each narrowed). The text before them, past any ``space``: a
    bare ``until-N``, or one with its markers (``"open"? until-N "close"?``, or such a group, optional)."""
    k = len(items) - 1
    while k >= 0 and not (_is_calls(items[k]) or _is_group(items[k])):
        k -= 1
    if k < 0:
        return items, None
    calls: str | None = items[k]
    if _is_group(items[k]):
        alternatives = [" ".join(_calls_only(_top_level_items(a) or [a], thinking, True)[0])
                        for a in _alternatives(items[k][1:-1])]
        items, calls = [*items[:k], "(" + " | ".join(dict.fromkeys(alternatives)) + ")", *items[k + 1:]], None
    j = k - 1
    while j >= 0 and items[j] == "space":
        j -= 1
    start = _text_block_start(items, j, thinking, nested)
    if start is None:
        before = items[:k]
    else:  # (text a marker opens: the parser's way out of a reasoning left open, which must now be closed)
        marked = not _TEXT.fullmatch(items[start])
        before = [_closed(item, thinking) if marked else item for item in items[:start]] + items[j + 1:k]
    return [*before, items[k], *(item for item in items[k + 1:] if not _TEXT.fullmatch(item))], calls


def _text_block_start(items: list[str], j: int, thinking: Sequence[str], nested: bool) -> int | None:
    """Where the free text that ends at items[j] starts (None: items[j] is no free text, or reasoning:
    a block that a thinking tag opens, closes or follows)."""
    if j < 0:
        return None
    if items[j].startswith("(") and items[j].endswith(")?"):  # ("open" until-N "close")?
        inner = _top_level_items(items[j][1:-2]) or []
        markers = [item for item in inner if not _TEXT.fullmatch(item)]
        plain = len(inner) - len(markers) == 1 and all(_is_literal(m) and not _is_thinking(m, thinking) for m in markers)
        return j if plain else None
    end = j - 1 if _is_literal(items[j]) and items[j].endswith("?") and j >= 1 and _TEXT.fullmatch(items[j - 1]) else j
    if not _TEXT.fullmatch(items[end]):
        return None
    opens = end >= 1 and _is_literal(items[end - 1]) and (items[end - 1].endswith("?") or (nested and end == 1))
    start = end - 1 if opens else end
    around = items[max(start - 1, 0):start] + items[start:end] + items[end + 1:j + 1]
    return None if any(_is_thinking(item, thinking) for item in around) else start


def _closed(item: str, thinking: Sequence[str]) -> str:
    """A reasoning group, optional, with its end tag required (Kimi K3's reasoning ends at its end tag
    or at the response section's opener)."""
    inner = _top_level_items(item[1:-2]) if item.startswith("(") and item.endswith(")?") else None
    if not inner or not (inner[-1].endswith("?") and _is_thinking(inner[-1], thinking)):
        return item
    return "(" + " ".join([*inner[:-1], inner[-1][:-1]]) + ")?"


def _without_trailing_text(items: list[str]) -> list[str]:
    """A rule's items without the free text (``until-N?``) after its last rule or group."""
    last = max((i for i, item in enumerate(items) if not (_is_literal(item) or item == "space" or _TEXT.fullmatch(item))),
               default=len(items) - 1)
    return [*items[:last + 1], *(item for item in items[last + 1:] if not _TEXT.fullmatch(item))]


def _is_calls(item: str) -> bool:
    return bool(_RULE_NAME.fullmatch(item)) and item != "space" and not _TEXT.fullmatch(item)


def _is_group(item: str) -> bool:
    return item.startswith("(") and item.endswith(")")


def _is_literal(item: str) -> bool:
    return item.startswith('"') and item.removesuffix("?").endswith('"')


def _is_thinking(item: str, thinking: Sequence[str]) -> bool:
    return item.removesuffix("?") in {_gbnf_literal(tag) for tag in thinking if tag}


def _gbnf_literal(text: str) -> str:
    return '"' + "".join(_GBNF_ESCAPES.get(ch, ch) for ch in text) + '"'


def _top_level_items(body: str) -> list[str] | None:
    """The items of a GBNF rule's body (a literal, a class, a group, a name, with its repetition mark),
    None if it has alternatives at its top level."""
    return None if len(_split(body, "|")) > 1 else [item for item in _split(body, " ") if item]


def _alternatives(body: str) -> list[str]:
    """A GBNF body's alternatives at its top level."""
    return [alternative.strip() for alternative in _split(body, "|")]


def _split(body: str, separator: str) -> list[str]:
    """A GBNF body cut where `separator` stands at its top level (outside groups, literals, classes)."""
    parts: list[str] = []
    depth, i, start = 0, 0, 0
    while i < len(body):
        if body[i] in '"[':  # a literal or a class, up to its unescaped end
            close, i = ('"' if body[i] == '"' else "]"), i + 1
            while body[i] != close:
                i += 2 if body[i] == "\\" else 1
        depth += (body[i] == "(") - (body[i] == ")")
        if depth == 0 and body[i] == separator:
            parts.append(body[start:i])
            start = i + 1
        i += 1
    return [*parts, body[start:]]


_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
