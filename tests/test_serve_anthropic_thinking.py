"""Anthropic's `thinking` and llama-server's `chat_template_kwargs` on /v1/messages, with the real
`anthropic` and `openai` clients, on the tiny model given Qwen3's template of the pinned tree (a
template that branches on enable_thinking: off, its generation prompt holds an empty reasoning,
"<think>\\n\\n</think>\\n\\n"). thinking enabled / disabled is the template's enable_thinking true /
false, the prompt the OpenAI route renders with that chat_template_kwargs; a bad shape, or a choice
that contradicts chat_template_kwargs, is a 400 saying what to send."""
from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import anthropic
import pytest

from test_serve import Server, start_server, stop_server
from tinymodel import write_tiny_llama
from upstream_programs import templates_dir

ASK = [{"role": "user", "content": "the capital of france is"}]
ENABLED = {"type": "enabled", "budget_tokens": 1024}
DISABLED = {"type": "disabled"}
EMPTY_REASONING = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("anthropic-thinking")
    model = write_tiny_llama(folder / "tiny-qwen3.gguf",
                             chat_template=(templates_dir() / "Qwen-Qwen3-0.6B.jinja").read_text())
    s = start_server(model, folder)
    yield s
    stop_server(s)


def claude(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def counted(server: Server, **fields: Any) -> int:
    return claude(server).messages.count_tokens(model="m", messages=ASK, **fields).input_tokens


def anthropic_answer(server: Server, **fields: Any) -> tuple[int, str, str]:
    """The prompt's tokens, the reply's text and its reasoning (greedy: the server's default)."""
    message = claude(server).messages.create(model="m", max_tokens=8, messages=ASK, **fields)
    text = "".join(b.text for b in message.content if b.type == "text")
    reasoning = "".join(b.thinking for b in message.content if b.type == "thinking")
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0), text, reasoning


def openai_answer(server: Server, enable_thinking: bool) -> tuple[int, str, str]:
    template_kwargs = {"chat_template_kwargs": {"enable_thinking": enable_thinking}}
    reply = server.client().chat.completions.create(model="m", max_tokens=8, messages=ASK, extra_body=template_kwargs)
    message = reply.choices[0].message
    return (reply.usage.prompt_tokens, message.content or "",
            (message.model_extra or {}).get("reasoning_content") or "")


def test_thinking_is_the_templates_enable_thinking(server):
    rendered = {enable: server.request("POST", "/apply-template", {
        "messages": ASK, "chat_template_kwargs": {"enable_thinking": enable}})[1]["prompt"] for enable in (True, False)}
    assert rendered[False] == rendered[True] + EMPTY_REASONING  # (Qwen3 thinks unless told not to)
    assert counted(server, thinking=DISABLED) > counted(server, thinking=ENABLED) == counted(server)
    for thinking, enable in [(ENABLED, True), (DISABLED, False)]:
        assert anthropic_answer(server, thinking=thinking) == openai_answer(server, enable)
        # the same choice in chat_template_kwargs (as llama-server's), alone or beside thinking
        for extra in [{"chat_template_kwargs": {"enable_thinking": enable}},
                      {"thinking": thinking, "chat_template_kwargs": {"enable_thinking": enable}}]:
            assert counted(server, extra_body=extra) == counted(server, thinking=thinking)
            assert anthropic_answer(server, extra_body=extra) == openai_answer(server, enable)


@pytest.mark.parametrize("thinking, says", [
    ({"type": "on"}, "type 'on' is not taken"),
    ({"type": "adaptive"}, "type 'adaptive' is not taken"),
    ({"type": "enabled"}, "budget_tokens None is not a positive integer"),
    ({"type": "enabled", "budget_tokens": 0}, "budget_tokens 0 is not a positive integer"),
    ({"type": "enabled", "budget_tokens": -5}, "budget_tokens -5 is not a positive integer"),
    ({"type": "enabled", "budget_tokens": "1024"}, "budget_tokens '1024' is not a positive integer"),
    ({"type": "enabled", "budget_tokens": 1024.5}, "budget_tokens 1024.5 is not a positive integer"),
    ({"type": "enabled", "budget_tokens": True}, "budget_tokens True is not a positive integer"),
    ({"type": "disabled", "budget_tokens": 1024}, "budget_tokens not taken"),
    ({"type": "enabled", "budget_tokens": 1024, "display": "omitted"}, "display not taken"),
    ("enabled", "is not an object"),
])
def test_a_bad_thinking_is_a_400_that_says_what_to_send(server, thinking, says):
    messages = claude(server).messages
    for ask in (partial(messages.create, max_tokens=4), messages.count_tokens):
        with pytest.raises(anthropic.BadRequestError) as refused:
            ask(model="m", messages=ASK, extra_body={"thinking": thinking})
        message = refused.value.body["error"]["message"]
        assert refused.value.body["error"]["type"] == "invalid_request_error"
        assert "body.thinking" in message and says in message, message
        assert ('send thinking as {"type": "enabled", "budget_tokens": N} (N a positive integer) or '
                '{"type": "disabled"}') in message, message
    assert server.request("GET", "/health")[0] == 200


def test_thinking_and_chat_template_kwargs_that_disagree_are_a_400(server):
    for thinking, enable in [(ENABLED, False), (DISABLED, True)]:
        with pytest.raises(anthropic.BadRequestError, match=rf"thinking.type '{thinking['type']}' and "
                           rf"chat_template_kwargs.enable_thinking {str(enable).lower()} disagree: send one of them"):
            claude(server).messages.create(model="m", max_tokens=4, messages=ASK, thinking=thinking,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": enable}})
    assert server.request("GET", "/health")[0] == 200
