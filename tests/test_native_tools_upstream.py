"""Every parser case of llama.cpp's own tests (the pinned tree's tests/test-chat.cpp, read as data by
upstream_chat_cases.py: a template, the request, a model output, the message llama.cpp's test expects):
llama.cpp's parser through our binding gives the message llama.cpp's test expects, and the server's
reader (native_reply.NativeReplyParser, fed the output in pieces as a generation feeds it) gives the
same content, reasoning and calls — for every tool-call format llama.cpp parses. Compared as
llama.cpp's test compares (assert_msg_equals, whitespace around content and reasoning ignored; the
arguments as JSON values; a call's id where the model writes one)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from pyllamaopt import ChatTemplate
from pyllamaopt.serve.native_reply import NativeReplyParser
from upstream_chat_cases import Call, Case, Message, read_cases
from upstream_programs import pinned_tree, templates_dir

CASES, LEFT_OUT = read_cases(pinned_tree() / "tests" / "test-chat.cpp")
_TEMPLATES: dict[str, ChatTemplate] = {}


def rendered(case: Case) -> Any:
    if case.template not in _TEMPLATES:
        _TEMPLATES[case.template] = ChatTemplate.from_file(templates_dir() / case.template)
    request = {"messages": [{"role": "user", "content": "Hey there!"}], **case.request}  # (its message_user)
    return _TEMPLATES[case.template].apply(request)


def compared(content: str, reasoning: str, calls: list[Call]) -> tuple[str, str, list[tuple[str, Any, str]]]:
    return content.strip(), reasoning.strip(), [(c.name, _arguments(c.arguments), c.id) for c in calls]


def _arguments(text: str) -> Any:
    """As llama.cpp's test compares them (renormalize_json): a JSON value, or nothing for a partial one."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def expected(case: Case) -> tuple[str, str, list[tuple[str, Any, str]]]:
    return compared(case.expect.content, case.expect.reasoning, list(case.expect.calls))


def parsed(message: dict[str, Any]) -> Message:
    calls = [Call(c["function"]["name"], c["function"]["arguments"], c.get("id") or "")
             for c in message.get("tool_calls", [])]
    return Message(message.get("content") or "", message.get("reasoning_content") or "", tuple(calls))


def test_the_reader_takes_most_of_llama_cpps_cases():
    """What is left out is listed by reason (an output built by code, a continued message, a JSON Schema)."""
    templates_with_calls = {c.template for c in CASES if c.expect.calls}
    assert len(CASES) >= 300 and len(templates_with_calls) >= 45, (len(CASES), LEFT_OUT)
    assert sum(LEFT_OUT.values()) < len(CASES) / 2, LEFT_OUT


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_llama_cpps_parser_through_our_binding_gives_what_its_tests_expect(case):
    message = parsed(json.loads(rendered(case).parser.parse(case.output, case.is_partial)))
    assert compared(message.content, message.reasoning, list(message.calls)) == expected(case)


@pytest.mark.parametrize("case", [c for c in CASES if not c.is_partial], ids=[c.id for c in CASES if not c.is_partial])
def test_the_servers_reader_gives_the_same_calls_fed_in_pieces(case):
    """The reply as the server sends it: content, reasoning and calls equal to llama.cpp's, whatever the
    pieces the generation feeds (a call's id is the model's where it writes one, else the server's own)."""
    prompt = rendered(case)
    for piece in (1, 7, len(case.output) or 1):
        reader = NativeReplyParser(prompt.parser, "call_", prompt.format)
        for i in range(0, len(case.output), piece):
            reader.feed(case.output[i:i + piece])
        reader.finish()
        reply = reader.result()
        assert reply.complete and reply.malformed is None, (piece, reply.malformed)
        ours = [Call(c.name, c.arguments, c.id if not c.id.startswith("call_") else "") for c in reply.calls]
        assert compared(reply.text, reply.reasoning, ours) == expected(case), piece

