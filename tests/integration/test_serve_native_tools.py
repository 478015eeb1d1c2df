"""Native tool calls through the server (issue 44): SmolLM2 135M Instruct served with a template that
takes tools in its own syntax (the pinned tree's Qwen2.5 template, --chat-template-file), driven by
the real `openai` and `anthropic` clients: the prompt is llama.cpp's rendering, a required call comes
back as OpenAI tool_calls / Anthropic tool_use (streamed and not, the same), the answer's pyllamaopt
field names the format, and the round trip (call, result) reuses the first request's KV."""
from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import pytest

from test_serve import Server, start_server, stop_server
from test_serve_tools import ADD, ANTHROPIC_TOOLS, ASK, RESULT, TOOLS, valid_arguments
from upstream_programs import templates_dir

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory) -> Iterator[Server]:
    template = templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"
    s = start_server(smollm2_path, tmp_path_factory.mktemp("native"), "--chat-template-file", str(template))
    yield s
    stop_server(s)


def test_the_prompt_is_the_templates_own_tool_syntax(served):
    status, out = served.request("POST", "/apply-template", {"messages": ASK, "tools": TOOLS})
    assert status == 200, out
    assert "<tools>" in out["prompt"] and '"name": "get_weather"' in out["prompt"]
    assert "tool_calls" not in out["prompt"]  # (not the generic format's instruction)


def test_a_required_call_is_parsed_from_the_models_syntax_streamed_or_not(served):
    client = served.client()
    reply = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=80)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    valid_arguments(call.function.name, call.function.arguments)
    assert reply.model_extra["pyllamaopt"]["tool_format"] not in ("generic", "none")
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                                 max_tokens=80, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = [t for d in deltas for t in (d.tool_calls or [])]
    assert streamed[0].function.name == call.function.name
    assert "".join(t.function.arguments or "" for t in streamed) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].model_extra["pyllamaopt"]["tool_format"] == reply.model_extra["pyllamaopt"]["tool_format"]


def test_anthropic_tool_use_and_the_round_trip_reuses_the_prompt(served):
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    ask = [{"role": "user", "content": ASK[1]["content"]}]
    first = client.messages.create(model="m", max_tokens=80, system=ASK[0]["content"], messages=ask,
                                   tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"})
    assert first.stop_reason == "tool_use", first
    use = [b for b in first.content if b.type == "tool_use"][0]
    valid_arguments(use.name, use.input)
    second = client.messages.create(
        model="m", max_tokens=20, system=ASK[0]["content"], tools=ANTHROPIC_TOOLS,
        messages=[*ask, {"role": "assistant", "content": first.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]}])
    assert second.usage.cache_read_input_tokens >= first.usage.input_tokens // 2, second.usage
    assert second.model_extra["pyllamaopt"]["tool_format"] == first.model_extra["pyllamaopt"]["tool_format"]


def test_the_openai_tool_loop_call_result_answer(served):
    client = served.client()
    messages = [{"role": "user", "content": "Add 2 and 3 with the add tool."}]
    tools = [t for t in TOOLS if t["function"]["name"] == "add"]
    first = client.chat.completions.create(model="m", messages=messages, tools=tools, tool_choice="required",
                                           max_tokens=60)
    [call] = first.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    assert set(args) == set(ADD["required"])
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": str(sum(args.values()))}]
    final = client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=20)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.usage.prompt_tokens_details.cached_tokens > 0
