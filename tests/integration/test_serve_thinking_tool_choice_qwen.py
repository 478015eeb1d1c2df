"""tool_choice "required", a named function and Anthropic's "any" on a template whose generation prompt
already holds the reply's reasoning, on Qwen2.5-Coder 0.5B Instruct given Qwen3's template of the
pinned tree with --chat-template-file, through the server with the real `openai` and `anthropic`
clients, greedy, streamed and not.

With enable_thinking false Qwen3's template ends the prompt with an empty, closed reasoning:
"<|im_start|>assistant\n<think>\n\n</think>\n\n". llama.cpp's grammar of a required call starts
with that generation prompt (its root: the generation prompt, then an optional reasoning); the
server's grammar takes it first, as llama.cpp's sampler does, so the call is forced from the reply's
first token: the reply is a valid call in the format's syntax, read into tool_calls / tool_use. (Left
free, as before, this model writes its calls as bare JSON, which no parser reads as a call.)

(QwQ's template, whose generation prompt opens the reasoning, "...assistant\n<think>\n", is taken the
same way — tests/test_native_tool_choice.py — but this model, not trained to reason, never ends its
reasoning there: the reply holds to the grammar, reasoning until max_tokens.)"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from test_serve import Server, start_server, stop_server
from test_serve_tool_choice_qwen import ANTHROPIC_TOOLS, SYSTEM, TOOLS, TWO_CITIES, WEATHER_IN_PARIS, calls_of, valid
from upstream_programs import templates_dir

pytestmark = pytest.mark.integration

QWEN3 = "Qwen-Qwen3-0.6B.jinja"
NO_THINKING = {"enable_thinking": False}
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 0, "max_tokens": 200}


@pytest.fixture(scope="module")
def served(qwen_path, tmp_path_factory) -> Iterator[tuple[Server, dict[str, Any]]]:
    """The server with Qwen3's template, and the body's field that turns its reasoning off."""
    s = start_server(qwen_path, tmp_path_factory.mktemp("qwen-thinking"), "--n-ctx", "2048",
                     "--chat-template-file", str(templates_dir() / QWEN3))
    yield s, {"chat_template_kwargs": NO_THINKING}
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


@pytest.mark.parametrize("tool_choice, names, asked", [
    ("required", {"get_weather", "add"}, (WEATHER_IN_PARIS, TWO_CITIES)),
    ({"type": "function", "function": {"name": "add"}}, {"add"}, (WEATHER_IN_PARIS,))], ids=["required", "named"])
def test_a_required_call_is_made_after_the_generation_prompt(served, tool_choice, names, asked):
    """One call (parallel_tool_calls false): allowed more, this model asked for two cities' weather on
    an AVX2 CPU made the two calls and then distinct `add` calls until max_tokens (its own loop: the
    grammar allows any number of calls; parallel calls: test_serve_tool_choice_qwen.py)."""
    for messages in asked:
        reply, reasoning = ask(served, messages, tool_choice=tool_choice, parallel_tool_calls=False)
        choice = reply.choices[0]
        assert reply.model_extra["pyllamaopt"]["tool_format"] == "hermes"
        assert choice.finish_reason == "tool_calls" and not (choice.message.content or "").strip(), choice
        calls = calls_of(reply)
        assert len(calls) == 1 and all(name in names and valid(name, arguments) for name, arguments in calls), calls
        assert "<tool_call>" not in reasoning and "</think>" not in reasoning, reasoning
        text, streamed_reasoning, finish, streamed_calls = streamed(served, messages, tool_choice=tool_choice,
                                                                   parallel_tool_calls=False)
        assert (text.strip(), streamed_reasoning, finish) == ("", reasoning, "tool_calls")
        assert streamed_calls == [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]


def test_anthropics_any_makes_a_tool_use_after_the_generation_prompt(qwen_path, tmp_path):
    """Qwen3's template with its reasoning off by default (the same generation prompt), the request
    without template arguments (as `thinking: {"type": "disabled"}` would render it:
    tests/test_serve_anthropic_thinking.py)."""
    source = (templates_dir() / QWEN3).read_text()
    switched = source.replace("enable_thinking is defined and enable_thinking is false", "true")
    assert switched != source
    (tmp_path / "qwen3-no-thinking.jinja").write_text(switched)
    server = start_server(qwen_path, tmp_path, "--n-ctx", "2048", "--chat-template-file",
                          str(tmp_path / "qwen3-no-thinking.jinja"))
    try:
        ask_claude(server)
    finally:
        stop_server(server)


def ask_claude(server: Server) -> None:
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    request: dict[str, Any] = dict(model="m", max_tokens=GREEDY["max_tokens"], system=SYSTEM["content"],
                                   tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"},
                                   messages=[{"role": "user", "content": WEATHER_IN_PARIS[1]["content"]}])
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
