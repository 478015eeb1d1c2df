"""tool_choice "required", a named function and Anthropic's "any" on a template whose generation prompt
opens the reply's reasoning, on Qwen2.5-Coder 0.5B Instruct given a thinking template of the pinned
tree with --chat-template-file, through the server with the real `openai` and `anthropic` clients,
greedy, streamed and not.

QwQ-32B's template ends the prompt with "<|im_start|>assistant\\n<think>\\n" (the reply starts inside
its reasoning), Qwen3's with enable_thinking false with "<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n"
(an empty reasoning, closed). llama.cpp's grammar of a required call starts with that generation
prompt; the server's grammar takes it first, as llama.cpp's sampler does, so the call is forced from
the reply's first token: the reply is a valid call in the format's syntax, read into tool_calls /
tool_use, its reasoning (if any) into reasoning_content / a thinking block. (Left free, as before,
this model writes its calls as bare JSON, which no parser reads as a call.)"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from test_serve import Server, start_server, stop_server
from test_serve_tool_choice_qwen import ANTHROPIC_TOOLS, SYSTEM, TOOLS, TWO_CITIES, WEATHER_IN_PARIS, calls_of, valid
from upstream_programs import templates_dir

pytestmark = pytest.mark.integration

# (template, chat_template_kwargs): a generation prompt that opens the reasoning, one that closes an empty one
TEMPLATES = {"qwq": ("Qwen-QwQ-32B.jinja", {}), "qwen3-no-thinking": ("Qwen-Qwen3-0.6B.jinja", {"enable_thinking": False})}
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 0, "max_tokens": 200}


@pytest.fixture(scope="module")
def servers(qwen_path, tmp_path_factory) -> Iterator[Callable[[str], tuple[Server, dict[str, Any]]]]:
    """A server per template of TEMPLATES, started when first asked for; and the body's extra fields."""
    started: dict[str, Server] = {}

    def server(name: str) -> tuple[Server, dict[str, Any]]:
        template, kwargs = TEMPLATES[name]
        if name not in started:
            started[name] = start_server(qwen_path, tmp_path_factory.mktemp("qwen-thinking"), "--n-ctx", "2048",
                                         "--chat-template-file", str(templates_dir() / template))
        return started[name], {"chat_template_kwargs": kwargs} if kwargs else {}

    yield server
    for s in started.values():
        stop_server(s)


def ask(served: tuple[Server, dict[str, Any]], messages: list[dict[str, Any]], **fields: Any) -> tuple[Any, str]:
    """The whole reply, and its reasoning."""
    server, extra = served
    reply = server.client().chat.completions.create(model="m", messages=messages, tools=TOOLS, **GREEDY, **fields,
                                                    extra_body=extra)
    return reply, (reply.choices[0].message.model_extra or {}).get("reasoning_content") or ""


def streamed(served: tuple[Server, dict[str, Any]], messages: list[dict[str, Any]], **fields: Any
             ) -> tuple[str, str, str, list[tuple[str, str]]]:
    """The streamed reply: its text, reasoning, finish reason and calls (name, arguments' text)."""
    server, extra = served
    text, reasoning, finish, calls = "", "", None, {}
    for chunk in server.client().chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                         **GREEDY, **fields, extra_body=extra):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for d in choice.delta.tool_calls or ():
                name, arguments = calls.get(d.index, ("", ""))
                calls[d.index] = (name + (d.function.name or ""), arguments + (d.function.arguments or ""))
            finish = choice.finish_reason or finish
    return text, reasoning, finish, list(calls.values())


@pytest.mark.parametrize("tool_choice, names", [("required", {"get_weather", "add"}),
                                                ({"type": "function", "function": {"name": "add"}}, {"add"})],
                         ids=["required", "named"])
@pytest.mark.parametrize("template", list(TEMPLATES))
def test_a_required_call_is_made_after_the_generation_prompt(servers, template, tool_choice, names):
    served = servers(template)
    for messages in (WEATHER_IN_PARIS, TWO_CITIES):
        reply, reasoning = ask(served, messages, tool_choice=tool_choice)
        choice = reply.choices[0]
        assert reply.model_extra["pyllamaopt"]["tool_format"] == "hermes"
        assert choice.finish_reason == "tool_calls" and not (choice.message.content or "").strip(), choice
        calls = calls_of(reply)
        assert calls and all(name in names and valid(name, arguments) for name, arguments in calls), calls
        assert "<tool_call>" not in reasoning and "</think>" not in reasoning, reasoning
        text, streamed_reasoning, finish, streamed_calls = streamed(served, messages, tool_choice=tool_choice)
        assert (text.strip(), streamed_reasoning, finish) == ("", reasoning, "tool_calls")
        assert streamed_calls == [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]


def test_anthropics_any_makes_a_tool_use_after_the_generation_prompt(servers):
    """(QwQ's template: the Anthropic route takes no template arguments to turn Qwen3's reasoning off)"""
    server, extra = servers("qwq")
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    request: dict[str, Any] = dict(model="m", max_tokens=GREEDY["max_tokens"], system=SYSTEM["content"],
                                   tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}, extra_body=extra,
                                   messages=[{"role": "user", "content": TWO_CITIES[1]["content"]}])
    message = claude.messages.create(**request)
    uses = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses and all(valid(*u) for u in uses), message
    assert not [b for b in message.content if b.type == "text" and b.text.strip()], message
    thinking = [b.thinking for b in message.content if b.type == "thinking"]
    with claude.messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == uses
    assert [b.thinking for b in final.content if b.type == "thinking"] == thinking
    assert final.stop_reason == "tool_use"
