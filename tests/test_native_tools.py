"""Native tool calls and reasoning, read by llama.cpp's parser through our binding: llama.cpp's own
test cases (the pinned tree's tests/test-chat.cpp: the same template, model output and expected
message) give the same content, reasoning and calls through ChatTemplate.apply(...).parser, and
through the server's reader (native_reply.NativeReplyParser) fed the output in pieces, as a
generation feeds it. A call the model breaks off is text, never a call."""
from __future__ import annotations

import json
from typing import Any

import pytest

from pyllamaopt import ChatTemplate
from pyllamaopt.serve.anthropic_routes import _turn
from pyllamaopt.serve.chat_messages import Tool, ToolChoice, ToolResult, Turn
from pyllamaopt.serve.chat_prompt import render_prompt
from pyllamaopt.serve.native_reply import NativeReplyParser
from pyllamaopt.serve.params import GenerateParams
from pyllamaopt.serve.reply_parser import CallStart, ReasoningPiece, TextPiece
from pyllamaopt.serve.schemas import AnthropicMessage
from tinymodel import CHATML
from upstream_programs import templates_dir

# test-chat.cpp's special_function_tool and special_function_tool_with_optional_param
SPECIAL = {"type": "function", "function": {"name": "special_function", "description": "I'm special", "parameters": {
    "type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}}, "required": ["arg1"]}}}
SPECIAL_OPT = {"type": "function", "function": {
    "name": "special_function_with_opt", "description": "I'm special but have optional stuff", "parameters": {
        "type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."},
                                         "arg2": {"type": "integer", "description": "The optional arg."}},
        "required": ["arg1"]}}}
HELLO = "Hello, world!\nWhat's up?"
CALL = ("special_function", {"arg1": 1})
XML_CALL = "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>"
HERMES_CALL = '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>'

# (test-chat.cpp line, template, request fields, model output, expected content, reasoning, calls)
CASES: list[tuple[int, str, dict[str, Any], str, str, str, list[tuple[str, dict[str, Any]]]]] = [
    (6107, "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", {}, HELLO, HELLO, "", []),
    (6108, "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", {"tools": [SPECIAL]}, HERMES_CALL, "", "", [CALL]),
    (6108, "Qwen-Qwen2.5-7B-Instruct.jinja", {"tools": [SPECIAL]}, HERMES_CALL, "", "", [CALL]),
    (6107, "Qwen-Qwen2.5-7B-Instruct.jinja", {}, HELLO, HELLO, "", []),
    (3340, "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", {"tools": [SPECIAL]},
     HELLO + '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>', HELLO, "", [CALL]),
    (5916, "mistralai-Mistral-Nemo-Instruct-2407.jinja", {"tools": [SPECIAL]},
     '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]', "", "", [CALL]),
    (5915, "mistralai-Mistral-Nemo-Instruct-2407.jinja", {}, HELLO, HELLO, "", []),
    (6300, "meta-llama-Llama-3.1-8B-Instruct.jinja", {"tools": [SPECIAL]}, HELLO, HELLO, "", []),
    (3555, "Qwen3-Coder.jinja", {"tools": [SPECIAL]}, XML_CALL, "", "", [CALL]),
    (2150, "Qwen3.5-4B.jinja", {"enable_thinking": True, "reasoning_format": "auto"},
     "I'm\nthinking\n</think>\n\n" + HELLO, HELLO, "I'm\nthinking", []),
    (2162, "Qwen3.5-4B.jinja", {"enable_thinking": False, "reasoning_format": "auto", "tools": [SPECIAL]},
     XML_CALL, "", "", [CALL]),
    (6066, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", {"reasoning_format": "deepseek"},
     "I'm\nthinking</think>" + HELLO, HELLO, "I'm\nthinking", []),
    (6070, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
     {"tools": [SPECIAL], "enable_thinking": False, "reasoning_format": "deepseek"},
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
     '```json\n{"arg1": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "", "", [CALL]),
    (5933, "meetkai-functionary-medium-v3.1.jinja", {"tools": [SPECIAL]},
     '<function=special_function>{"arg1": 1}</function>', "", "", [CALL]),
    (2186, "Qwen3.5-4B.jinja", {"enable_thinking": False, "reasoning_format": "auto", "parallel_tool_calls": True,
                                "tools": [SPECIAL, SPECIAL_OPT]},
     XML_CALL + "\n<tool_call>\n<function=special_function_with_opt>\n<parameter=arg1>\n1\n</parameter>\n"
     "<parameter=arg2>\n2\n</parameter>\n</function>\n</tool_call>", "", "",
     [CALL, ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
]
IDS = [f"{template.removesuffix('.jinja')}-line{line}" for line, template, *_ in CASES]


def rendered(template: str, fields: dict[str, Any]) -> Any:
    request = {"messages": [{"role": "user", "content": "Hey there!"}], "reasoning_format": "none", **fields}
    return ChatTemplate.from_file(templates_dir() / template).apply(request)


def calls_of(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def read(content: str, reasoning: str, calls: list[tuple[str, dict[str, Any]]]) -> tuple[str, str, list[Any]]:
    """As llama.cpp's tests compare a message (test-chat.cpp:1216, assert_msg_equals ignoring whitespace
    differences): content and reasoning stripped; the calls' arguments as JSON values."""
    return content.strip(), reasoning.strip(), calls


@pytest.mark.parametrize("line, template, fields, output, content, reasoning, calls", CASES, ids=IDS)
def test_our_binding_reads_what_llama_cpps_tests_expect(line, template, fields, output, content, reasoning, calls):
    message = json.loads(rendered(template, fields).parser.parse(output, False))
    assert read(message["content"], message.get("reasoning_content", ""), calls_of(message)) == \
        read(content, reasoning, calls)


@pytest.mark.parametrize("line, template, fields, output, content, reasoning, calls", CASES, ids=IDS)
@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_the_servers_reader_gives_the_same_fed_in_pieces(line, template, fields, output, content, reasoning, calls,
                                                         piece):
    prompt = rendered(template, fields)
    reader = NativeReplyParser(prompt.parser, "call_", prompt.format)
    pieces = [p for i in range(0, len(output), piece) for p in reader.feed(output[i:i + piece])]
    pieces += reader.finish()
    reply = reader.result()
    assert read(reply.text, reply.reasoning, [(c.name, json.loads(c.arguments)) for c in reply.calls]) == \
        read(content, reasoning, calls)
    assert reply.complete and reply.malformed is None and reply.tool_format == prompt.format
    whole = json.loads(prompt.parser.parse(output, False))  # the pieces add up to the whole parse
    assert "".join(p.text for p in pieces if isinstance(p, TextPiece)) == whole["content"] == reply.text
    assert "".join(p.text for p in pieces if isinstance(p, ReasoningPiece)) == whole.get("reasoning_content", "")
    assert [p.name for p in pieces if isinstance(p, CallStart)] == [name for name, _ in calls]


@pytest.mark.parametrize("template", ["NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
                                      "Qwen-Qwen2.5-7B-Instruct.jinja"])
def test_a_call_broken_off_is_text_never_a_call(template):
    """test-chat.cpp line 6160's cut-off call: llama.cpp's (lenient) parse holds the call so far, its
    arguments cut; the reply that ends there is the model's text, and says why."""
    prompt = rendered(template, {"tools": [SPECIAL]})
    cut = '<tool_call>\n{"name": "special_function", "arguments": {"arg'
    partial = json.loads(prompt.parser.parse(cut, True))
    assert [c["function"] for c in partial["tool_calls"]] == [{"name": "special_function", "arguments": '{"arg'}]
    reader = NativeReplyParser(prompt.parser, "call_", prompt.format)
    pieces = reader.feed(cut) + reader.finish()
    reply = reader.result()
    assert reply.calls == () and not reply.complete and reply.text == cut and reply.malformed
    assert not any(isinstance(p, CallStart) for p in pieces)
    assert "".join(p.text for p in pieces if isinstance(p, TextPiece)) == cut


@pytest.mark.parametrize("template, output", [
    ("Qwen-Qwen3-0.6B.jinja", "<think>\nI'm\nthinking\n</think>\n\n" + HELLO),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "I'm\nthinking\n</think>\n\n" + HELLO)])
def test_a_reply_without_tools_has_its_reasoning_apart(template, output):
    """A thinking template's reply, with no tools in the request, is read by llama.cpp's parser as
    llama-server reads it: the reasoning apart from the content (the server's reasoning_content /
    thinking blocks); a template that does not think keeps the plain-text reader."""
    turns, params = [Turn("user", "Hey there!")], GenerateParams()
    prompt = render_prompt(ChatTemplate.from_file(templates_dir() / template), turns, [], ToolChoice(), params)
    assert prompt.native is not None and prompt.tool_format == "none"
    reader = NativeReplyParser(prompt.native, "call_", prompt.tool_format)
    for i in range(0, len(output), 3):
        reader.feed(output[i:i + 3])
    reader.finish()
    reply = reader.result()
    assert (reply.text.strip(), reply.reasoning.strip(), reply.calls) == (HELLO, "I'm\nthinking", ())
    assert render_prompt(ChatTemplate(CHATML), turns, [], ToolChoice(), params).native is None


@pytest.mark.parametrize("template, name", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"), ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "hermes"),
    ("Qwen-Qwen3-0.6B.jinja", "hermes"), ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3_json"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"), ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral"),
    ("Qwen3-Coder.jinja", "qwen3_coder"), ("GLM-4.6.jinja", "glm45"), ("openai-gpt-oss-120b.jinja", "gpt-oss"),
    ("llama-cpp-deepseek-r1.jinja", "deepseek_v3"), ("meetkai-functionary-medium-v3.1.jinja", "functionary_v3.1"),
    ("google-gemma-2-2b-it.jinja", "generic")])
def test_a_format_is_named_as_users_know_it(template, name):
    assert ChatTemplate.from_file(templates_dir() / template).tool_format == name


def test_every_native_template_of_the_tree_has_a_name_beyond_llama_cpps():
    """llama.cpp's own names (peg-native, ...) are the fallback for a syntax chat_formats.py does not know."""
    names = {p.name: ChatTemplate.from_file(p).tool_format for p in templates_dir().glob("*.jinja")}
    assert not {t: n for t, n in names.items() if n.startswith("peg-")}, names


def test_an_anthropic_thinking_block_sent_back_is_the_turns_reasoning():
    """Qwen3's template renders the reasoning of an assistant turn after the last user message (a tool
    loop): a thinking block sent back with the call is in the prompt, where the template puts it."""
    said = _turn(AnthropicMessage.model_validate({"role": "assistant", "content": [
        {"type": "thinking", "thinking": "I should call it.", "signature": ""},
        {"type": "tool_use", "id": "call_1", "name": "special_function", "input": {"arg1": 1}}]}), "messages[1]")
    assert said.reasoning == "I should call it." and [c.name for c in said.calls] == ["special_function"]
    turns = [Turn("user", "Call it."), said, Turn("user", results=[ToolResult("call_1", "done")])]
    tools = [Tool("special_function", "I'm special", SPECIAL["function"]["parameters"])]
    prompt = render_prompt(ChatTemplate.from_file(templates_dir() / "Qwen-Qwen3-0.6B.jinja"), turns, tools,
                           ToolChoice(), GenerateParams())
    assert "<|im_start|>assistant\n<think>\nI should call it.\n</think>\n\n<tool_call>" in prompt.text
