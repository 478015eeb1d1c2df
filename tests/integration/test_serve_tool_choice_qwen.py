"""tool_choice in the model's own tool-call format, on Qwen2.5-Coder 0.5B Instruct (its GGUF
template: Hermes-style <tool_call>, the peg-native format), through the server with the real
`openai` and `anthropic` clients, greedy. "auto" applies llama.cpp's call grammar lazily (from
"<tool_call>\n" on, as llama-server does): a reply in text is the model's own, streamed the same;
"none" gives text. "required", a named function and Anthropic's "any" / "tool" apply the call grammar
from the reply's first token, and the reply opens with "<tool_call>": a call parsed into tool_calls /
tool_use, its arguments valid against the tool's schema; parallel_tool_calls false: one call.

(This model at Q4 writes its calls as bare JSON, `{"name": ..., "arguments": ...}`, without the
<tool_call> tags its template asks for: with "auto" the lazy grammar does not fire and llama.cpp's
parser reads the reply as text, here and in llama-server alike; with "required" the pinned tree's
grammar let that text come before a call, so it never called: docs/clients.md.)"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
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
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]
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


def streamed_message(served: Server, messages: list[dict[str, Any]], **fields: Any) -> tuple[dict[str, Any], str]:
    """The streamed reply put together as the assistant message a client sends back, and its finish reason."""
    text, finish, calls = "", None, {}
    for chunk in served.client().chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                         **GREEDY, **fields):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for d in choice.delta.tool_calls or ():
                call = calls.setdefault(d.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] += d.id or ""
                if d.function:
                    call["function"]["name"] += d.function.name or ""
                    call["function"]["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    message = {"role": "assistant", "content": text, **({"tool_calls": list(calls.values())} if calls else {})}
    return message, finish


def streamed(served: Server, messages: list[dict[str, Any]], **fields: Any) -> tuple[str, str, list[Any]]:
    """The streamed reply: its text, finish reason and calls."""
    message, finish = streamed_message(served, messages, **fields)
    return message["content"], finish, [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                        for c in message.get("tool_calls", ())]


def calls_of(reply: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in reply.choices[0].message.tool_calls or ()]


def valid(name: str, arguments: dict[str, Any]) -> bool:
    """The arguments match the tool's schema (the enum's codes; two integers)."""
    if name == "get_weather":
        return arguments.keys() == {"city"} and arguments["city"] in CODES
    return name == "add" and arguments.keys() == {"a", "b"} and all(type(v) is int for v in arguments.values())


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


def test_required_makes_a_call_in_the_models_syntax(served):
    """The reply opens with "<tool_call>" (the model alone writes bare JSON), so the call is read into
    tool_calls, its arguments valid against the schema; streamed the same."""
    for messages in (WEATHER_IN_PARIS, HELLO):
        reply = ask(served, messages, tool_choice="required")
        choice = reply.choices[0]
        assert reply.model_extra["pyllamaopt"]["tool_format"] == "hermes"
        assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
        calls = calls_of(reply)
        assert calls and all(valid(name, arguments) for name, arguments in calls), calls
        assert streamed(served, messages, tool_choice="required") == ("", "tool_calls", calls)


def test_a_named_function_is_the_call_made(served):
    named = {"type": "function", "function": {"name": "add"}}
    reply = ask(served, WEATHER_IN_PARIS, tool_choice=named)
    calls = calls_of(reply)
    assert reply.choices[0].finish_reason == "tool_calls" and calls, reply.choices[0]
    assert all(name == "add" and valid(name, arguments) for name, arguments in calls), calls
    assert streamed(served, WEATHER_IN_PARIS, tool_choice=named) == ("", "tool_calls", calls)


def test_parallel_tool_calls_false_makes_one_call(served):
    reply = ask(served, TWO_CITIES, tool_choice="required", parallel_tool_calls=False)
    calls = calls_of(reply)
    assert reply.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and valid(*calls[0]), calls
    assert streamed(served, TWO_CITIES, tool_choice="required", parallel_tool_calls=False) == ("", "tool_calls", calls)


@pytest.mark.parametrize("tool_choice, names", [({"type": "any"}, {"get_weather", "add"}),
                                                ({"type": "tool", "name": "add"}, {"add"}),
                                                ({"type": "any", "disable_parallel_tool_use": True}, {"get_weather", "add"})])
def test_anthropics_any_and_tool_make_a_tool_use(served, tool_choice, names):
    claude = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    request: dict[str, Any] = dict(model="m", max_tokens=80, system=SYSTEM["content"], tools=ANTHROPIC_TOOLS,
                                   tool_choice=tool_choice, messages=[{"role": "user", "content": TWO_CITIES[1]["content"]}])
    message = claude.messages.create(**request)
    uses = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses and not [b for b in message.content if b.type == "text"], message
    assert all(name in names and valid(name, arguments) for name, arguments in uses), uses
    assert not tool_choice.get("disable_parallel_tool_use") or len(uses) == 1, uses
    with claude.messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == uses
    assert final.stop_reason == "tool_use"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("then", ["auto", "none"])
def test_a_tool_loop_call_result_answer(served, stream, then):
    """As a user's agent loop goes: a call required, the call and its result sent back (the assistant
    message as the client got it, a tool message), then tool_choice auto or none: an answer in text.
    The second request reuses the first one's prompt."""
    messages: list[Any] = list(WEATHER_IN_PARIS)
    if stream:
        message, finish = streamed_message(served, messages, tool_choice="required")
        call_id = message["tool_calls"][0]["id"]
        messages.append(message)
    else:
        first = ask(served, messages, tool_choice="required")
        finish, call_id = first.choices[0].finish_reason, first.choices[0].message.tool_calls[0].id
        messages.append(first.choices[0].message)  # (the openai client sends its own message object back)
    assert finish == "tool_calls" and call_id
    messages.append({"role": "tool", "tool_call_id": call_id, "content": "Sunny, 24 degrees Celsius, light wind."})
    if stream:
        answer, finish = streamed_message(served, messages, tool_choice=then)
        text, calls = answer["content"], answer.get("tool_calls")
    else:
        second = ask(served, messages, tool_choice=then)
        finish, text, calls = second.choices[0].finish_reason, second.choices[0].message.content, \
            second.choices[0].message.tool_calls
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens // 2, second.usage
    assert finish in ("stop", "length") and text and not calls, (finish, text, calls)
