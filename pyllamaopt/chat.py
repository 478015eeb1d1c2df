"""Chat convenience: render a model's chat template with jinja2 and keep a conversation.

Raw tokens remain the contract; this module only produces them from messages.
"""
from __future__ import annotations

import bisect
import datetime
import functools
import itertools
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.sandbox

from .errors import ChatTemplateError

if TYPE_CHECKING:
    from .model import Model
    from .session import Generation, Session

Message = dict[str, str]

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


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template: {message}")


# The largest string or list a template may build with one operator or padding call: a chat
# prompt is far smaller, and `'x' * 10**10` would take the memory of the machine.
MAX_BUILT_SIZE = 1 << 24
_PADDING_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox (no attribute starting with `_`, no mutation of the messages),
    and a bound on the values a short template can blow up: repetition (`*`), powers (`**`) and
    str padding methods. A template can still spend time (nested loops of jinja2's 100,000-item
    ranges): it is a sandbox against escapes, not against its author's denial of service."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for sequence, times in ((left, right), (right, left)):
                if isinstance(sequence, (str, bytes, list, tuple)) and isinstance(times, int):
                    _check_size(len(sequence) * times, "a repetition")
        elif isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            _check_size(right * abs(left).bit_length() // 8, "a power")  # (in bytes)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        if getattr(__obj, "__name__", None) in _PADDING_METHODS and isinstance(getattr(__obj, "__self__", None), str):
            for size in (*args, *kwargs.values()):
                if isinstance(size, int):
                    _check_size(size, f"str.{__obj.__name__}")
        return super().call(__context, __obj, *args, **kwargs)


def _check_size(size: int, what: str) -> None:
    if size > MAX_BUILT_SIZE:
        raise jinja2.sandbox.SecurityError(f"{what} of size {size} is more than a chat template may build "
                                           f"({MAX_BUILT_SIZE})")


class ChatTemplate:
    """A jinja2 chat template (rendered in a sandbox, as llama-cpp-python does). Whatever goes
    wrong in it, a sandbox escape refused included, is a ChatTemplateError."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"invalid chat template: {exc}") from None
        except Exception as exc:  # e.g. RecursionError on deeply nested expressions
            raise ChatTemplateError(f"invalid chat template: {type(exc).__name__}: {exc}") from None
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def for_model(cls, model: Model) -> ChatTemplate:
        """The model's own template, else a built-in one for its architecture."""
        source = model.chat_template or BUILTIN_TEMPLATES.get(model.architecture)
        if source is None:
            raise ChatTemplateError(
                f"model {model.path!r} has no chat template and none is built in for architecture "
                f"{model.architecture!r}; pass template=ChatTemplate('...jinja...')")
        special = lambda t: model.detokenize([t], special=True) if t >= 0 else ""  # noqa: E731
        return cls(source, bos_token=special(model.bos_token), eos_token=special(model.eos_token))

    @functools.cached_property
    def takes_tools(self) -> bool:
        """Whether the template renders tool definitions given as ``tools=[...]`` (Hugging Face's
        convention): found by rendering a probe tool and looking for its name, as llama.cpp does."""
        probe = "pyllamaopt_probe_tool"
        tools = [{"type": "function", "function": {"name": probe, "description": "",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        try:
            return probe in self.render([{"role": "user", "content": "x"}], tools=tools)
        except ChatTemplateError:
            return False

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True, **extra: Any) -> str:
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ChatTemplateError(f"message {i} must be a dict with str 'role' and 'content', got {m!r}")
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except ChatTemplateError:  # raise_exception(), the template's own message
            raise
        except jinja2.TemplateError as exc:  # a sandbox escape refused (SecurityError) among them
            raise ChatTemplateError(f"chat template failed to render: {exc}") from None
        except Exception as exc:  # the template's own bug: 1/0, a bad filter argument, recursion, ...
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from None

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
