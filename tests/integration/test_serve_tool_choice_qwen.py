"""tool_choice and parallel_tool_calls in the model's own tool-call format, on Qwen2.5-Coder 0.5B
Instruct (its GGUF template: Hermes-style <tool_call>, the peg-native format), through the server
with the real `openai` client, greedy. "auto" applies llama.cpp's call grammar lazily, from the
format's "<tool_call>" on, as llama-server does: a call the model begins is constrained to a valid
call (a city code from the tool's enum, which the model does not write unconstrained), while a reply
in text is the model's own; "none" gives text only, "required" a call, a named function a call of
that function, parallel_tool_calls false at most one call."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from test_serve import Server, start_server, stop_server

pytestmark = pytest.mark.integration

CODES = ["FR-PAR", "GB-LON", "US-NYC"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": CODES, "description": "The city's code"}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "The sum of two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
WEATHER_IN_PARIS = [SYSTEM, {"role": "user", "content": "What is the weather in Paris?"}]
TWO_CITIES = [SYSTEM, {"role": "user", "content": "What is the weather in Paris and in London?"}]
HELLO = [SYSTEM, {"role": "user", "content": "Say hello to me in French."}]
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 0, "max_tokens": 80}


@pytest.fixture(scope="module")
def served(qwen_path, tmp_path_factory) -> Iterator[Server]:
    s = start_server(qwen_path, tmp_path_factory.mktemp("qwen-tools"), "--n-ctx", "2048")
    yield s
    stop_server(s)


def ask(served: Server, messages: list[dict[str, Any]], **fields: Any) -> Any:
    return served.client().chat.completions.create(model="m", messages=messages, tools=TOOLS, **GREEDY, **fields)


def calls_of(reply: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in reply.choices[0].message.tool_calls or ()]


def streamed(served: Server, messages: list[dict[str, Any]], **fields: Any) -> tuple[str, str, list[Any]]:
    """The streamed reply: its text, finish reason and calls."""
    text, finish, calls = "", None, {}
    for chunk in served.client().chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                         **GREEDY, **fields):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for d in choice.delta.tool_calls or ():
                call = calls.setdefault(d.index, ["", ""])
                if d.function:
                    call[0] += d.function.name or ""
                    call[1] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    return text, finish, [(name, json.loads(arguments)) for name, arguments in calls.values()]


def test_auto_constrains_a_call_the_model_begins(served):
    """The model begins a call ("<tool_call>"): from there llama.cpp's call grammar holds, so the
    city is one of the enum's codes (free, the model writes the city's name); streamed the same."""
    reply = ask(served, WEATHER_IN_PARIS, tool_choice="auto")
    assert reply.model_extra["pyllamaopt"]["tool_format"] == "peg-native"
    assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0]
    calls = calls_of(reply)
    assert [name for name, _ in calls] == ["get_weather"] and calls[0][1]["city"] in CODES, calls
    assert streamed(served, WEATHER_IN_PARIS, tool_choice="auto") == ("", "tool_calls", calls)


def test_auto_leaves_a_text_reply_free(served):
    reply = ask(served, HELLO, tool_choice="auto")
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls and choice.message.content
    assert reply.usage.prompt_tokens_details is not None
    assert streamed(served, HELLO, tool_choice="auto") == (choice.message.content, "stop", [])


def test_none_answers_in_text(served):
    reply = ask(served, WEATHER_IN_PARIS, tool_choice="none")
    choice = reply.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason in ("stop", "length") and choice.message.content


def test_required_and_a_named_function_make_that_call(served):
    required = ask(served, HELLO, tool_choice="required")
    assert required.choices[0].finish_reason == "tool_calls" and calls_of(required), required.choices[0]
    for name, arguments in calls_of(required):
        assert name in ("get_weather", "add") and (name != "get_weather" or arguments["city"] in CODES)
    named = ask(served, WEATHER_IN_PARIS, tool_choice={"type": "function", "function": {"name": "add"}})
    calls = calls_of(named)
    assert named.choices[0].finish_reason == "tool_calls" and calls and {n for n, _ in calls} == {"add"}, calls
    assert all(isinstance(a["a"], int) and isinstance(a["b"], int) for _, a in calls)


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_parallel_tool_calls_false_makes_one_call(served, choice):
    """Two cities: the model calls twice, or once with parallel_tool_calls false (the grammar ends the
    reply after one call)."""
    both = calls_of(ask(served, TWO_CITIES, tool_choice=choice))
    assert [name for name, _ in both] == ["get_weather", "get_weather"], both
    one = ask(served, TWO_CITIES, tool_choice=choice, parallel_tool_calls=False)
    assert one.choices[0].finish_reason == "tool_calls" and calls_of(one) == both[:1], calls_of(one)
