"""Chat convenience: a model's chat template applied by llama.cpp's chat layer, and a conversation.

Raw tokens remain the contract; this module only produces them from messages.
"""
from __future__ import annotations

import bisect
import itertools
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import _core
from .chat_formats import tool_format_name
from .errors import ChatTemplateError

if TYPE_CHECKING:
    from .model import Model
    from .session import Generation, Session

Message = dict[str, Any]  # OpenAI's shape: role, content; an assistant's tool_calls, a tool's tool_call_id

# Used when a GGUF file carries no template (Gemma 3 270M's does not): the published turn
# format of the architecture's family.
BUILTIN_TEMPLATES: dict[str, str] = {
    "gemma3": (
        "{{ bos_token }}"
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
        "{%- set loop_messages = messages[1:] -%}"
        "{%- else -%}"
        "{%- set first_user_prefix = '' -%}"
        "{%- set loop_messages = messages -%}"
        "{%- endif -%}"
        "{%- for message in loop_messages -%}"
        "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{%- endif -%}"
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
        "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
        "{{ message['content'] | trim }}"
        "{{ '<end_of_turn>\\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
    ),
}


class ChatTemplate:
    """A chat template, applied by llama.cpp's chat layer (common/chat and its jinja engine) as
    llama-server applies it: the same prompt for the same messages, tools and arguments, and the
    format of the model's replies (its tool calls, its reasoning). Whatever goes wrong in it is a
    ChatTemplateError naming the template, and the line where llama.cpp tells it.

    >>> ChatTemplate.from_file("qwen2.5.jinja").render([{"role": "user", "content": "Hi"}])
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 name: str = "(given as a string)", tool_use: str | None = None) -> None:
        """`tool_use`: a second template for requests with tools, as a GGUF file may carry one
        (``tokenizer.chat_template.tool_use``): llama.cpp renders a request that has tools with it."""
        self._core = _core.ChatTemplates.from_source(source, bos_token, eos_token, name)
        self._tool_use = (_core.ChatTemplates.from_source(tool_use, bos_token, eos_token, f"{name} (tool_use)")
                          if tool_use else None)
        self._tool_format: str | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, model: Model | None = None) -> ChatTemplate:
        """The template in a file (as llama-server's --chat-template-file); with `model`, its BOS
        and EOS tokens are the model's."""
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(f"cannot read the chat template file {os.fspath(path)!r}: {exc}") from None
        if not source:
            raise ChatTemplateError(f"the chat template file {os.fspath(path)!r} is empty")
        return cls(source, name=os.fspath(path), **({} if model is None else _special_texts(model)))

    @classmethod
    def for_model(cls, model: Model, *, file: str | os.PathLike[str] | None = None) -> ChatTemplate:
        """The template in `file`, else the model's own (with its tool_use variant, if the GGUF file
        has one: as llama.cpp's common_chat_templates_init reads them, the variant standing in for a
        missing default), else a built-in one for its architecture."""
        if file is not None:
            return cls.from_file(file, model=model)
        tool_use = model.metadata.get(TOOL_USE_KEY) or None
        own = model.chat_template or tool_use
        if own:
            return cls(own, name=f"of {model.path}", tool_use=tool_use, **_special_texts(model))
        source = BUILTIN_TEMPLATES.get(model.architecture)
        if source is None:
            raise ChatTemplateError(
                f"model {model.path!r} has no chat template and none is built in for architecture "
                f"{model.architecture!r}; pass template=ChatTemplate('...jinja...') or a template file")
        return cls(source, name=f"built in for {model.architecture}", **_special_texts(model))

    @property
    def source(self) -> str:
        return self._core.source

    @property
    def takes_tools(self) -> bool:
        """Whether the template (the tool_use variant, if there is one) renders tool definitions given as
        ``tools=[...]`` (Hugging Face's convention): llama.cpp's capabilities of the template, found by
        rendering probes."""
        return self._with_tools.caps.get("supports_tools", False)

    @property
    def native_tools(self) -> bool:
        """Whether the template (the tool_use variant, if there is one) renders tool definitions and an
        assistant's calls in the model's own syntax, so that llama.cpp's chat layer knows the format of
        its calls."""
        caps = self._with_tools.caps
        return caps.get("supports_tools", False) and caps.get("supports_tool_calls", False)

    @property
    def tool_format(self) -> str:
        """The name of the format of the template's tool calls, as users know it ("hermes", "llama3_json",
        "mistral", ...: chat_formats.py, from the markup the template writes for a call), or "generic"
        for a template without native tools (the server's own format)."""
        if self._tool_format is None:
            self._tool_format = tool_format_name(self) if self.native_tools else "generic"
        return self._tool_format

    @property
    def _with_tools(self) -> _core.ChatTemplates:
        """The template a request with tools is rendered with (llama.cpp's choice)."""
        return self._tool_use or self._core

    def apply(self, request: Mapping[str, Any]) -> _core.RenderedChat:
        """A chat request (``messages``, and as llama-server takes them ``tools``, ``tool_choice``,
        ``parallel_tool_calls``, ``add_generation_prompt``, ``enable_thinking``,
        ``chat_template_kwargs``) rendered: the prompt, the reply's format, grammar and parser. A
        request with tools is rendered with the tool_use variant, if there is one."""
        for i, m in enumerate(request.get("messages", ())):
            content = m.get("content") if isinstance(m, dict) else None
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not (
                    isinstance(content, (str, list)) or (content is None and m.get("tool_calls"))):
                raise ChatTemplateError(f"message {i} must be a dict with a str 'role' and a 'content' (a str, or "
                                        f"text parts) or 'tool_calls', got {m!r}")
        try:
            text = json.dumps(request, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ChatTemplateError(f"the chat request is not JSON: {exc}") from None
        return (self._with_tools if request.get("tools") else self._core).apply(text)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: str | None = None,
               parallel_tool_calls: bool | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> str:
        """The prompt of `messages`; `tools` in OpenAI's shape, `tool_choice` "auto", "required" or
        "none"; other keyword arguments (and `chat_template_kwargs`) are the template's own:
        ``enable_thinking=False``, ..."""
        return self.apply(chat_request(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                       tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                                       chat_template_kwargs=chat_template_kwargs, **kwargs)).prompt

    def render_marked(self, messages: Sequence[Message], marks: Mapping[int, Sequence[tuple[int, int]]], *,
                      add_generation_prompt: bool = True, **extra: Any) -> tuple[str, list[tuple[int, int]]]:
        """``render``, and where parts of the messages' contents are in its text: `marks` maps a
        message's index to [start, end) character ranges of its content; returns the text (what
        ``render`` returns) and those ranges in it, in text order. They are found by rendering
        each marked content as a placeholder; a template that changes a content other than by
        trimming it gets no ranges ([]), its text unchanged."""
        text = self.render(messages, add_generation_prompt=add_generation_prompt, **extra)
        marked = {i: list(r) for i, r in marks.items() if r and 0 <= i < len(messages)}
        if not marked:
            return text, []
        holders = [{**m, "content": _PLACEHOLDER.format(i)} if i in marked else m for i, m in enumerate(messages)]
        try:
            skeleton = self.render(holders, add_generation_prompt=add_generation_prompt, **extra)
        except ChatTemplateError:  # the template looks at the content
            return text, []
        spans = _locate(skeleton, text, messages, marked)
        return text, spans if spans is not None else []


TOOL_USE_KEY = "tokenizer.chat_template.tool_use"  # a GGUF file's template for requests with tools


def _special_texts(model: Model) -> dict[str, str]:
    """The model's BOS and EOS tokens as the text a template writes (bos_token, eos_token)."""
    special = lambda t: model.detokenize([t], special=True) if t >= 0 else ""  # noqa: E731
    return {"bos_token": special(model.bos_token), "eos_token": special(model.eos_token)}


def chat_request(messages: Sequence[Message], *, add_generation_prompt: bool = True,
                 tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: str | None = None,
                 parallel_tool_calls: bool | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                 **kwargs: Any) -> dict[str, Any]:
    """ChatTemplate.render's arguments as the request ChatTemplate.apply takes (llama-server's fields)."""
    kwargs = {**(chat_template_kwargs or {}), **kwargs}
    request: dict[str, Any] = {"messages": list(messages), "add_generation_prompt": add_generation_prompt}
    if tools:
        request["tools"] = list(tools)
    if tool_choice is not None:
        request["tool_choice"] = tool_choice
    if parallel_tool_calls is not None:
        request["parallel_tool_calls"] = parallel_tool_calls
    if kwargs:
        request["chat_template_kwargs"] = kwargs
        if isinstance(kwargs.get("enable_thinking"), bool):  # (as llama-server reads it)
            request["enable_thinking"] = kwargs["enable_thinking"]
    return request


_PLACEHOLDER = "\ue000pyllamaopt-mark-{}\ue001"
_PLACEHOLDERS = re.compile("\ue000pyllamaopt-mark-(\\d+)\ue001")


def _locate(skeleton: str, text: str, messages: Sequence[Message],
            marks: Mapping[int, list[tuple[int, int]]]) -> list[tuple[int, int]] | None:
    """Where the marked ranges are in `text`, walking the skeleton's literal pieces and the
    contents in place of its placeholders (each as it is, or trimmed as jinja2's ``trim``
    does); None if `text` is not the skeleton filled so."""
    holders = [m for m in _PLACEHOLDERS.finditer(skeleton) if int(m.group(1)) in marks]
    spans: list[tuple[int, int]] = []
    at, last = 0, 0  # in text, in skeleton
    for k, m in enumerate(holders):
        literal = skeleton[last:m.start()]
        if not text.startswith(literal, at):
            return None
        at += len(literal)
        following = skeleton[m.end():holders[k + 1].start() if k + 1 < len(holders) else len(skeleton)]
        content = messages[int(m.group(1))]["content"]
        for lead, body in ((0, content), (len(content) - len(content.lstrip()), content.strip())):
            if text.startswith(body, at) and text.startswith(following, at + len(body)):
                break
        else:
            return None
        for a, b in marks[int(m.group(1))]:
            a, b = max(0, a - lead), min(len(body), b - lead)
            if a < b:
                spans.append((at + a, at + b))
        at, last = at + len(body), m.end()
    return sorted(spans) if text[at:] == skeleton[last:] else None


def prompt_tokens(model: Model, template: ChatTemplate, messages: Sequence[Message], text: str,
                  **render: Any) -> list[int]:
    """`text` (`template`'s rendering of `messages` with the `render` arguments) as tokens: the
    template's markup parsed as the model's special tokens, the messages' contents as text — a user
    or a tool result writing "<|im_end|>" gets those characters, not the end of a turn (a forged
    turn). A content that reads the same either way (almost every one) changes nothing: the text is
    tokenized whole, as before; else the contents that would parse as special tokens are tokenized
    apart, as plain text (on a SentencePiece vocabulary that prefixes a space, each piece tokenized
    apart gains one). ChatTemplateError if the template changes such a content (other than by
    trimming it), which leaves no way to tell it from the markup."""
    for m in messages:
        for call in m.get("tool_calls") or ():
            function = call.get("function") or {}
            for part in (function.get("name"), function.get("arguments")):
                if isinstance(part, str) and model.has_special_text(part):
                    raise ChatTemplateError("a tool call's name or arguments contain the model's special-token text "
                                            "(such as a turn's end), which the template would write as markup: "
                                            "remove that text from the call")
        if isinstance(m.get("reasoning_content"), str) and model.has_special_text(m["reasoning_content"]):
            raise ChatTemplateError("an assistant message's reasoning contains the model's special-token text (such "
                                    "as a turn's end), which the template would write as markup: remove that text")
    tokens = model.tokenize(text, add_bos=False, special=True)
    forged = {i: [(0, len(m["content"]))] for i, m in enumerate(messages)
              if isinstance(m.get("content"), str) and m["content"] and model.has_special_text(m["content"])}
    if not forged:
        return tokens
    rendered, spans = template.render_marked(messages, forged, **render)
    spans = [(a, b) for a, b in spans if b <= len(text)]
    if not spans or not rendered.startswith(text):
        raise ChatTemplateError("a message contains the model's special-token text (such as a turn's end), and the "
                                "chat template changes that message, so it cannot be kept apart from the markup: "
                                "remove that text from the message")
    out: list[int] = []
    at = 0
    for a, b in spans:
        out += model.tokenize(text[at:a], add_bos=False, special=True) + model.tokenize(text[a:b], add_bos=False)
        at = b
    return out + model.tokenize(text[at:], add_bos=False, special=True)


def token_spans(model: Model, text: str, tokens: Sequence[int],
                char_spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The tokens (`text` tokenized whole, special tokens as text) that lie wholly inside each
    [start, end) character range of `text`, as [start, end) token positions; a range without a
    whole token is left out. [] if the tokens' pieces do not spell the text (a tokenizer that
    normalizes it); a space the tokenizer puts in front is allowed for."""
    pieces = [model.token_bytes(t, special=True) for t in tokens]
    spelled, data = b"".join(pieces), text.encode()
    offset = len(spelled) - len(data)  # the tokenizer's leading space, if any
    if offset < 0 or spelled[offset:] != data or spelled[:offset].strip():
        return []
    ends = [e - offset for e in itertools.accumulate(map(len, pieces))]
    starts = [0 - offset] + ends[:-1]
    out = []
    for a, b in char_spans:
        first = bisect.bisect_left(starts, len(text[:a].encode()))  # the first token starting in the range
        end = bisect.bisect_right(ends, len(text[:b].encode()))  # past the last token ending in it
        if first < end:
            out.append((first, end))
    return out


class Chat:
    """A conversation on one session.

    >>> chat = Chat(ctx.session(), system="You are terse.")
    >>> chat.send("Name a prime number.")
    """

    def __init__(self, session: Session, *, system: str | None = None, template: ChatTemplate | None = None) -> None:
        self.session = session
        self.template = template or ChatTemplate.for_model(session.context.model)
        self.messages: list[Message] = [{"role": "system", "content": system}] if system else []

    def stream(self, content: str, *, role: str = "user", **generate_kwargs: Any) -> Generation:
        """Add a message (a user's; with ``role="tool"``, a tool result, if the template takes
        that role) and stream the reply; the reply joins the messages when it ends. Tool
        messages are marked for sparse attention over tool results (``sparse_attn_enabled``,
        Tier 2, off by default: without it the marks change nothing)."""
        self.session.end_generation_in_progress()  # a reply in progress ends (joining the messages) first
        self.messages.append({"role": role, "content": content})
        try:
            tools = {i: [(0, len(m["content"]))] for i, m in enumerate(self.messages) if m["role"] == "tool"}
            prompt, marked = self.template.render_marked(self.messages, tools, add_generation_prompt=True)
            model = self.session.context.model
            tokens = prompt_tokens(model, self.template, self.messages, prompt, add_generation_prompt=True)
            self.session.sync(tokens, tool_spans=token_spans(model, prompt, tokens, marked) if marked else ())
            return self.session.generate(
                **generate_kwargs,
                on_finish=lambda g: self.messages.append({"role": "assistant", "content": g.text}))
        except BaseException:  # (Ctrl-C in the prefill too) a turn that could not start leaves no message
            self.messages.pop()
            raise

    def send(self, content: str, *, role: str = "user", **generate_kwargs: Any) -> str:
        """Add a message (see stream) and return the whole reply."""
        generation = self.stream(content, role=role, **generate_kwargs)
        for _ in generation:
            pass
        return generation.text
