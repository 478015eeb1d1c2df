"""Native tool calls through the server (issue 44): SmolLM2 135M Instruct served with a template that
takes tools in its own syntax (the pinned tree's Qwen2.5 template, --chat-template-file), driven by
the real `openai` and `anthropic` clients: the prompt is llama.cpp's rendering, a reply is read in the
native format (a valid call or text, never a malformed call; streamed and not, the same), the answer's
pyllamaopt field names the format, and a history with a call and its result renders in the template's own markup
and reuses the first request's KV."""
from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from test_serve import Server, start_server, stop_server
from test_serve_tools import ANTHROPIC_TOOLS, ASK, RESULT, TOOLS, valid_arguments
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


def test_a_reply_is_read_in_the_native_format_streamed_or_not(served):
    """A call required: the reply opens with "<tool_call>" (the server's narrowing of llama.cpp's
    grammar, native_prompt.reply_grammar); SmolLM2 135M's call is either whole (valid arguments) or
    cut by max_tokens (then text), never a malformed call; streamed and not, the same."""
    client = served.client()
    reply = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=40)
    choice = reply.choices[0]
    assert reply.model_extra["pyllamaopt"]["tool_format"] == "hermes"
    if choice.finish_reason == "tool_calls":
        for call in choice.message.tool_calls:
            valid_arguments(call.function.name, call.function.arguments)
    else:
        assert choice.finish_reason == "length" and choice.message.content and not choice.message.tool_calls
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                                 max_tokens=40, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == (choice.message.content or "")
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    assert chunks[-1].model_extra["pyllamaopt"]["tool_format"] == "hermes"


def test_a_call_and_its_result_render_natively_and_the_next_request_reuses_the_prompt(served):
    client = served.client()
    first = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=8)
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "unit": "celsius"}'}}]}
    history = [*ASK, call, {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]
    status, out = served.request("POST", "/apply-template", {"messages": history, "tools": TOOLS})
    assert status == 200 and '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"' in out["prompt"]
    assert "<tool_response>\n" + RESULT in out["prompt"]
    second = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=8)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens // 2, second.usage
    claude = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    message = claude.messages.create(model="m", max_tokens=8, system=ASK[0]["content"], tools=ANTHROPIC_TOOLS,
                                     messages=[{"role": "user", "content": ASK[1]["content"]}])
    assert message.model_extra["pyllamaopt"]["tool_format"] == "hermes"
