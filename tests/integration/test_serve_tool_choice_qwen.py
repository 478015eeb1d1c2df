"""tool_choice in the model's own tool-call format, on Qwen2.5-Coder 0.5B Instruct (its GGUF
template: Hermes-style <tool_call>, the peg-native format), through the server with the real
`openai` client, greedy. "auto" applies llama.cpp's call grammar lazily (from "<tool_call>\n" on,
as llama-server does): a reply in text is the model's own, streamed the same; "none" gives text.

(This model at Q4 writes its calls as bare JSON, `{"name": ..., "arguments": ...}`, without the
<tool_call> tags its template asks for: the lazy grammar does not fire and llama.cpp's parser reads
the reply as text, here and in llama-server alike; docs/clients.md.)"""
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
HELLO = [SYSTEM, {"role": "user", "content": "Say hello to me in French."}]
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 0, "max_tokens": 80}


@pytest.fixture(scope="module")
def served(qwen_path, tmp_path_factory) -> Iterator[Server]:
    s = start_server(qwen_path, tmp_path_factory.mktemp("qwen-tools"), "--n-ctx", "2048")
    yield s
    stop_server(s)


def ask(served: Server, messages: list[dict[str, Any]], **fields: Any) -> Any:
    return served.client().chat.completions.create(model="m", messages=messages, tools=TOOLS, **GREEDY, **fields)


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
