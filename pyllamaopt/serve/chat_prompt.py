"""A chat request's prompt: the turns rendered with the model's template, tools in the generic format.

Rendering is a pure function: it returns the prompt and what the reply needs of the generation (its
grammar, whether it is parsed as the generic format), and changes nothing it is given.

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

A template that renders tools and calls itself (``ChatTemplate.native_tools``, llama.cpp's
capabilities of it) gets them in the model's own format instead (native_prompt.py): the history as
llama-server renders it, the reply read by llama.cpp's parser for the format (native_reply.py). A
template that renders tool definitions but no calls gets the definitions that way (``tools=``), the
reply and the history in the generic format.
"""
from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..chat import ChatTemplate, Message, chat_request, token_spans
from ..chat import prompt_tokens as chat_prompt_tokens
from ..errors import ChatTemplateError, InvalidArgumentError
from ..model import Model
from ..stop_strings import stop_list
from .chat_messages import Tool, ToolChoice, Turn, compact
from .errors import BadRequest
from .native_prompt import grammar_prefill, native_messages, native_render_args
from .native_prompt import reply_grammar as native_reply_grammar
from .params import GenerateParams, ReplyFormat
from .reply_grammar import reply_grammar

INSTRUCTION = (
    'Reply with one JSON object and nothing else: {"tool_calls":[{"name":"...","arguments":{...}}]} to call '
    'one or more of the tools, or {"response":"..."} to answer the user. Tool results come back as '
    '{"tool_results":[{"name":"...","content":"..."}]}.')


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    generic: bool  # the reply is in the generic format (ReplyParser reads it)
    # with mark_tool_results: the [start, end) characters of each tool result's content in `text`
    tool_results: list[tuple[int, int]] = field(default_factory=list)
    # how `text` was rendered: its messages' contents are tokenized as text (chat.prompt_tokens)
    template: ChatTemplate | None = None
    messages: list[Message] = field(default_factory=list)
    render_args: dict[str, Any] = field(default_factory=dict)
    # with tools: the grammar of the reply (generic: reply_grammar.py; native: llama.cpp's, where it
    # constrains the reply from its start)
    reply_grammar: str | None = None
    reply_triggers: tuple[tuple[str, str | int], ...] = ()  # native: a lazy grammar's triggers (tool_choice "auto")
    reply_prefill: str = ""  # native: what the grammar takes before the reply (native_prompt.grammar_prefill)
    native: Any = None  # the native format's reply parser (_core.ChatReplyParser)
    tool_format: str = "none"  # "generic", the native format's name (ChatTemplate.tool_format), "none" (no tools)
    stops: tuple[str, ...] = ()  # native: the format's own ends of a reply (llama.cpp's additional_stops)

    def generate_params(self, params: GenerateParams, call_id_prefix: str) -> GenerateParams:
        """The request's `params` as this prompt's reply needs them, a new value: with tools, the
        reply's grammar; the reply parsed as it streams (the service's events carry the parse), its
        calls' ids starting with `call_id_prefix`."""
        grammar = self.reply_grammar if self.tool_format != "none" else params.grammar
        return replace(params, grammar=grammar, grammar_triggers=self.reply_triggers, grammar_prefill=self.reply_prefill,
                       stop=[*params.stop, *self.stops],
                       reply=ReplyFormat(self.generic, call_id_prefix, self.native, self.tool_format))


def render_prompt(template: ChatTemplate, turns: Sequence[Turn], tools: Sequence[Tool], choice: ToolChoice,
                  params: GenerateParams, *, mark_tool_results: bool = False, continue_last: bool = False,
                  template_kwargs: Mapping[str, Any] | None = None) -> ChatPrompt:
    """The rendered prompt (`params` is read, to refuse what cannot be combined with tools); with
    tools, its reply's grammar; with `mark_tool_results`, where the tool results' contents are in
    it (for sparse attention over tool results); with `continue_last`, a last assistant turn is
    continued (Anthropic's prefill: its text ends the prompt, no new turn opened);
    `template_kwargs`: the template's own arguments (llama-server's chat_template_kwargs). Every
    error is a BadRequest."""
    kwargs = {"chat_template_kwargs": dict(template_kwargs)} if template_kwargs else {}
    _check_tools(tools)
    prefill = _text_to_continue(turns) if continue_last else None
    if prefill is not None and tools:
        raise BadRequest("a last assistant message (a prefill to continue) cannot be combined with tools: the "
                         "reply's format is the tool-calling one; send the request without it")
    generic = bool(tools)
    grammar = None
    if generic:
        if params.json_schema is not None or params.grammar is not None:
            raise BadRequest("response_format cannot be combined with tools, nor can grammar: the reply's format is the "
                             "tool-calling one (docs/serve.md); describe the answer's shape as a tool's parameters instead")
        grammar = reply_grammar(tools, choice)
        try:  # (they apply to the answer's decoded text: GenerateParams.engine_kwargs)
            stop_list(params.stop)
        except InvalidArgumentError as exc:
            raise BadRequest(str(exc)) from None
    else:
        _check_choice_without_tools(choice)
    if generic and template.native_tools:
        return _render_native(template, turns, tools, choice, mark_tool_results, kwargs)
    definitions = generic and template.takes_tools  # (rendered by the template, the calls in the generic format)
    messages, results = _messages(turns, generic)
    if generic:
        system = INSTRUCTION if definitions else system_text(tools)
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + system}
        else:
            messages.insert(0, {"role": "system", "content": system})
            results.insert(0, [])
    extra: dict[str, Any] = {"tools": [{"type": "function", "function": _definition(t)} for t in tools]} if definitions else {}
    if prefill == "":  # nothing to continue: the reply is a new turn
        messages, results = messages[:-1], results[:-1]
    elif prefill:  # rendered with a mark after it, to find where it ends (not inside the end of its turn)
        messages[-1] = {**messages[-1], "content": prefill + _PREFILL_END}
    marked: list[tuple[int, int]] = []
    render_args = {"add_generation_prompt": not prefill, **extra, **kwargs}
    try:
        rendered = template.apply(chat_request(messages, **render_args))
        if mark_tool_results:
            marked = template.render_marked(messages, dict(enumerate(results)), **render_args)[1]
    except ChatTemplateError as exc:
        raise BadRequest(str(exc)) from None
    text = rendered.prompt
    # a reply that may think (<think>...</think> and the formats' equivalents) is read by llama.cpp's parser,
    # its reasoning apart, as llama-server reads it; a generic reply's JSON, a continued one and text by ours
    native = rendered.parser if rendered.supports_thinking and not generic and not prefill else None
    if prefill:
        end = text.find(_PREFILL_END)
        if end < 0 or not text[:end].endswith(prefill):
            raise BadRequest("the chat template changes the last assistant message's text, so the reply cannot "
                             "continue it; send the request without it")
        text = text[:end]  # what the template puts after the turn (its end) is left out
        marked = [(a, b) for a, b in marked if b <= len(text)]
    return ChatPrompt(text, generic, marked, template, messages, render_args, grammar, native=native,
                      tool_format="generic" if generic else "none")


def _render_native(template: ChatTemplate, turns: Sequence[Turn], tools: Sequence[Tool], choice: ToolChoice,
                   mark_tool_results: bool, kwargs: dict[str, Any]) -> ChatPrompt:
    """The prompt in the model's own tool-calling format (native_prompt.py). Its grammar is
    llama.cpp's, applied as llama.cpp applies it: from the reply's first token, past the generation
    prompt (a call required: the reply opens with the call, native_prompt.reply_grammar and
    grammar_prefill), or lazily, from the format's opening tag on (tool_choice "auto": the reply is
    free until it begins a call)."""
    _call_names(turns)
    messages, results = native_messages(turns)
    render_args = {**native_render_args(tools, choice, add_generation_prompt=True), **kwargs}
    try:
        rendered = template.apply(chat_request(messages, **render_args))
        marked = (template.render_marked(messages, results, **render_args)[1]
                  if mark_tool_results and results else [])
    except ChatTemplateError as exc:
        raise BadRequest(str(exc)) from None
    grammar, triggers = native_reply_grammar(rendered.grammar, rendered.grammar_lazy, rendered.grammar_triggers,
                                             rendered.generation_prompt, choice.parallel,
                                             (rendered.thinking_start_tag, *rendered.thinking_end_tags))
    prefill = grammar_prefill(rendered.grammar, rendered.grammar_lazy, rendered.generation_prompt)
    return ChatPrompt(rendered.prompt, False, marked, template, messages, render_args, grammar, triggers, prefill,
                      native=rendered.parser, tool_format=template.tool_format, stops=tuple(rendered.additional_stops))


_PREFILL_END = "\u2063pyllamaopt-prefill-end\u2063"  # (U+2063: text no message has, kept by any template)


def _text_to_continue(turns: Sequence[Turn]) -> str | None:
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


async def render_in_thread(template: ChatTemplate, model: Model, turns: Sequence[Turn], tools: Sequence[Tool],
                           choice: ToolChoice, params: GenerateParams, *, mark_tool_results: bool = False,
                           continue_last: bool = False, template_kwargs: Mapping[str, Any] | None = None,
                           ) -> tuple[ChatPrompt, list[int], list[tuple[int, int]]]:
    """`render_prompt` and `prompt_tokens`, off the event loop: a long history takes tens of
    milliseconds to render and tokenize, during which other connections' streams would stall."""
    def work() -> tuple[ChatPrompt, list[int], list[tuple[int, int]]]:
        rendered = render_prompt(template, turns, tools, choice, params, mark_tool_results=mark_tool_results,
                                 continue_last=continue_last, template_kwargs=template_kwargs)
        return (rendered, *prompt_tokens(model, rendered))

    return await asyncio.to_thread(work)


def prompt_tokens(model: Model, prompt: ChatPrompt) -> tuple[list[int], list[tuple[int, int]]]:
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


def _call_names(turns: Sequence[Turn]) -> dict[str, str]:
    """Call id -> function name, of every call; a result for a call not made before it is a 400."""
    names: dict[str, str] = {}
    for i, turn in enumerate(turns):
        for c in turn.calls:
            names[c.id] = c.name
        for r in turn.results:
            if r.call_id not in names:
                raise BadRequest(f"messages[{i}]: a tool result for call {r.call_id!r}, but no earlier assistant "
                                 "message made that call")
    return names


def _messages(turns: Sequence[Turn], generic: bool) -> tuple[list[Message], list[list[tuple[int, int]]]]:
    """The turns as the template's messages: calls, results and (with tools) text answers in the
    generic format; results merged with the user message that follows them. And for each
    message, the [start, end) characters of its tool results' contents in its content."""
    names = _call_names(turns)
    merged: list[Turn] = []
    for turn in turns:
        last = merged[-1] if merged else None
        if last is not None and last.role == "user" == turn.role and last.results and not last.text:
            last.results = last.results + turn.results
            last.text = turn.text
        else:
            merged.append(Turn(turn.role, turn.text, list(turn.calls), list(turn.results), turn.reasoning))
    contents = [_content(t, names, generic) for t in merged]
    return [{"role": t.role, "content": c, **({"reasoning_content": t.reasoning} if t.reasoning and not generic else {})}
            for t, (c, _) in zip(merged, contents)], [r for _, r in contents]


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
