"""tool_choice "required" (and a named function) and parallel_tool_calls in the models' own tool-call
formats: what the server's reply grammar allows (native_prompt.reply_grammar over llama.cpp's grammar
of the format), checked with an independent GBNF recognizer and sampler (tests/gbnf_check.py), and
read back by llama.cpp's parser of the format.

A call required: the reply opens with a call in the format's syntax (the pinned tree's grammar lets
any text come first: a model that writes a call without its tags never calls); parallel_tool_calls
false: one call (the per-call JSON formats repeated the call anyway); true: more than one."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gbnf_check import Grammar, parse_gbnf
from pyllamaopt import ChatTemplate
from pyllamaopt.chat import chat_request
from pyllamaopt.serve.chat_messages import Tool, ToolChoice, Turn
from pyllamaopt.serve.chat_prompt import ChatPrompt, render_prompt
from pyllamaopt.serve.native_prompt import narrowed_grammar, native_messages, native_render_args
from pyllamaopt.serve.params import GenerateParams
from upstream_programs import templates_dir

QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"
WEATHER = Tool("get_weather", "The weather in a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
ADD = Tool("add", "The sum of two integers", {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})
ASK = [Turn("system", "You are a helpful assistant."), Turn("user", "What is the weather in Paris and in London?")]


def forced(template: str, choice: ToolChoice) -> tuple[Grammar, ChatPrompt]:
    prompt = render_prompt(ChatTemplate.from_file(templates_dir() / template), ASK, [WEATHER, ADD], choice,
                           GenerateParams())
    assert prompt.reply_grammar is not None and not prompt.reply_triggers  # applied from the reply's start
    return parse_gbnf(prompt.reply_grammar), prompt


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


PARIS, LONDON, SUM = hermes("get_weather", {"city": "Paris"}), hermes("get_weather", {"city": "London"}), \
    hermes("add", {"a": 2, "b": 3})
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'  # what Qwen2.5-Coder 0.5B writes


def test_a_required_call_opens_the_reply_in_the_formats_syntax():
    grammar, prompt = forced(QWEN, ToolChoice("required"))
    assert grammar.matches(PARIS) and grammar.matches(SUM) and grammar.matches("\n" + PARIS)
    for text in (BARE, BARE + "\n\n" + PARIS, "Sure! " + PARIS, "", "Paris is sunny."):
        assert not grammar.matches(text), text
    message = json.loads(prompt.native.parse(PARIS, False))
    assert not message.get("content") and [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]


def test_a_named_function_is_the_only_call_allowed():
    grammar, _ = forced(QWEN, ToolChoice("required", "add"))
    assert grammar.matches(SUM) and not grammar.matches(PARIS) and not grammar.matches(BARE)


def test_parallel_tool_calls_false_allows_one_call_true_more():
    two = PARIS + "\n" + LONDON
    one, _ = forced(QWEN, ToolChoice("required", parallel=False))
    assert one.matches(PARIS) and not one.matches(two) and not one.matches(PARIS + "\n" + SUM)
    more, _ = forced(QWEN, ToolChoice("required", parallel=True))
    assert more.matches(two) and more.matches(PARIS + "\n" + SUM + "\n" + LONDON)


def test_parallel_tool_calls_false_also_caps_the_lazy_grammar_of_auto():
    prompt = render_prompt(ChatTemplate.from_file(templates_dir() / QWEN), ASK, [WEATHER, ADD],
                           ToolChoice("auto", parallel=False), GenerateParams())
    assert prompt.reply_triggers == (("word", "<tool_call>\n"),)
    grammar = parse_gbnf(prompt.reply_grammar)  # (from the trigger's match on)
    assert grammar.matches(PARIS) and not grammar.matches(PARIS + "\n" + LONDON)


# templates whose required grammar the server narrows, one or more of each format; every reply the
# narrowed grammar allows is read by llama.cpp's parser as calls and no text (GLM-4.6's is left out: a
# reasoning the pinned tree's grammar allows, "<think></x</</think>", its parser refuses)
NARROWED = ["Qwen-Qwen2.5-7B-Instruct.jinja", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "Qwen-Qwen3-0.6B.jinja", "ibm-granite-granite-4.0.jinja",
            "meta-llama-Llama-3.1-8B-Instruct.jinja", "Qwen3-Coder.jinja", "ByteDance-Seed-OSS.jinja",
            "moonshotai-Kimi-K2.jinja", "meetkai-functionary-medium-v3.1.jinja", "MiniMax-M1.jinja",
            "unsloth-Apriel-1.5.jinja", "upstage-Solar-Open-100B.jinja", "GigaChat3.1-10B-A1.8B.jinja",
            # a response section before the calls (Command R+), text before and after them (Ling 3), an
            # alternative of text then calls (Functionary v3.2, whose calls repeat whatever
            # parallel_tool_calls says)
            "CohereForAI-c4ai-command-r-plus-tool_use.jinja", "inclusionai-ling-3.0-flash.jinja",
            "meetkai-functionary-medium-v3.2.jinja"]


@pytest.mark.parametrize("template", NARROWED)
@pytest.mark.parametrize("parallel", [True, False])
def test_every_reply_the_required_grammar_allows_is_calls_only(template, parallel):
    grammar, prompt = forced(template, ToolChoice("required", parallel=parallel))
    rng = random.Random(44)
    for _ in range(25):
        text = grammar.sample(rng)
        message = json.loads(prompt.native.parse(text, False))
        calls = message.get("tool_calls") or []
        assert calls and not (message.get("content") or "").strip(), (text, message)
        assert parallel or len(calls) == 1, (text, message)


THINKING = "Qwen-QwQ-32B.jinja"  # its generation prompt opens the reasoning: "<|im_start|>assistant\n<think>\n"


def test_a_generation_prompt_that_opens_the_thinking_is_taken_by_the_grammar_first():
    """llama.cpp's root starts with the generation prompt, which here ends inside its reasoning rule:
    the grammar is kept whole and takes the generation prompt before the reply (as llama.cpp's sampler
    feeds it the prompt's tokens), so the reply goes on with the reasoning, then must call."""
    prompt = render_prompt(ChatTemplate.from_file(templates_dir() / THINKING), ASK, [WEATHER], ToolChoice("required"),
                           GenerateParams())
    assert prompt.reply_prefill == "<|im_start|>assistant\n<think>\n" and not prompt.reply_triggers
    assert prompt.generate_params(GenerateParams(), "call_").grammar_prefill == prompt.reply_prefill
    grammar = parse_gbnf(prompt.reply_grammar)
    thought = "The user asks for the weather in Paris and London.\n</think>"  # (the call right after it: below)
    assert grammar.matches(prompt.reply_prefill + thought + PARIS)
    assert grammar.matches(prompt.reply_prefill + thought + PARIS + "\n" + LONDON)
    # (the narrowed root has no text between the reasoning and the calls: QwQ's grammar had only the text
    # before the calls there, "\n\n" included)
    for reply in (thought, thought + BARE, thought + "Sure! " + PARIS, thought + "\n\n" + PARIS, PARIS,
                  "I will call it. " + PARIS):
        assert not grammar.matches(prompt.reply_prefill + reply), reply
    message = json.loads(prompt.native.parse(thought + PARIS, False))
    assert message["reasoning_content"].strip() == thought.split("</think>")[0].strip()
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]


def test_a_generation_prompt_the_root_starts_with_is_taken_out_of_it():
    """(the same as taking it first: the grammar starts at the reply, nothing to prefill)"""
    prompt = render_prompt(ChatTemplate.from_file(templates_dir() / QWEN), ASK, [WEATHER], ToolChoice("required"),
                           GenerateParams())
    assert prompt.reply_prefill == "" and parse_gbnf(prompt.reply_grammar).matches(PARIS)


def native_templates() -> list[str]:
    return sorted(p.name for p in templates_dir().glob("*.jinja") if ChatTemplate.from_file(p).native_tools)


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("template", native_templates())
def test_every_native_required_grammar_takes_its_prefill(template, thinking):
    """Every template of the pinned tree with native tools, a call required, reasoning on and off: the
    reply's grammar is applied (never left free), and what it takes first is a start it allows."""
    prompt = render_prompt(ChatTemplate.from_file(templates_dir() / template), ASK, [WEATHER, ADD],
                           ToolChoice("required"), GenerateParams(), template_kwargs={"enable_thinking": thinking})
    assert prompt.reply_grammar and not prompt.reply_triggers
    assert parse_gbnf(prompt.reply_grammar).matches(prompt.reply_prefill, prefix=True), prompt.reply_prefill


def test_command_r7b_loses_its_response_section_before_the_call():
    """(Not sampled as the others: llama.cpp's call grammar for Command R7B lets a call's object open
    with a comma where its optional id is left out, `{,"tool_name": ...}`, which its parser refuses.)"""
    grammar, prompt = forced("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", ToolChoice("required"))
    call = ('<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}]'
            '<|END_ACTION|>')
    thought = "<|START_THINKING|>The user wants the weather.<|END_THINKING|>"
    assert grammar.matches(call) and grammar.matches(thought + call)
    assert not grammar.matches("<|START_RESPONSE|>Let me look.<|END_RESPONSE|>" + call)
    message = json.loads(prompt.native.parse(thought + call, False))
    assert not message.get("content") and [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]


@pytest.mark.parametrize("template", ["deepseek-ai-DeepSeek-V3.2.jinja", "Kimi-K3.jinja"])
@pytest.mark.parametrize("parallel", [True, False])
def test_a_grammar_that_starts_before_the_thinking_is_narrowed_too(template, parallel):
    """Narrowed as llama.cpp builds the grammar, its root from the generation prompt on (what an engine
    that feeds the grammar the generation prompt first applies), where the generation prompt opens the
    thinking: DeepSeek V3.2's root lets text come after the thinking, before the calls; Kimi K3's a
    response section (and its calls repeat whatever parallel_tool_calls says). Every reply that
    continues the generation prompt is reasoning and calls, no text."""
    rendered = ChatTemplate.from_file(templates_dir() / template).apply(chat_request(
        native_messages(ASK)[0], **native_render_args([WEATHER, ADD], ToolChoice("required", parallel=parallel), True)))
    grammar = parse_gbnf(narrowed_grammar(rendered.grammar, True, parallel,
                                          (rendered.thinking_start_tag, *rendered.thinking_end_tags)))
    rng, replies, tries = random.Random(44), 0, 0
    while replies < 20:
        text, tries = grammar.sample(rng), tries + 1
        assert tries < 500
        if not text.startswith(rendered.generation_prompt):
            continue  # (a reply to another generation prompt: thinking off)
        replies += 1
        message = json.loads(rendered.parser.parse(text[len(rendered.generation_prompt):], False))
        calls = message.get("tool_calls") or []
        assert calls and not (message.get("content") or "").strip(), (text, message)
        assert parallel or len(calls) == 1, (text, message)
