"""The server's one field policy on the tiny model, with the real `openai` and `anthropic` clients:
logit_bias and the repetition penalties (OpenAI's, and llama.cpp's repeat_penalty / repeat_last_n)
answer what the library answers with them; a field the server does not take is a 400 naming it,
on every route (an SDK's extra_body included), while the fields that cannot change an answer
(user, metadata, ...) are accepted and change nothing."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from pyllamaopt import Context, Model
from test_serve import N_CTX, Server, start_server, stop_server
from tinymodel import CHATML, write_tiny_llama

PROMPT = list(range(10, 10 + 90))
ASK = [{"role": "user", "content": "the capital of france is"}]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("fields") / "tiny-chatml.gguf", chat_template=CHATML)


@pytest.fixture(scope="module")
def server(chat_model, tmp_path_factory) -> Iterator[Server]:
    s = start_server(chat_model, tmp_path_factory.mktemp("serve-fields"))
    yield s
    stop_server(s)


def local(model_path, prompt: list[int], max_tokens: int, **sampling: Any) -> list[int]:
    """The library's greedy answer with these settings, on a context of its own."""
    with Context(Model(str(model_path)), n_ctx=N_CTX, n_threads=2) as ctx:
        s = ctx.session()
        s.append(prompt)
        return [t.id for t in s.generate(max_tokens, **sampling)]


def session_tokens(server: Server, body: dict[str, Any], prompt: list[int] = PROMPT) -> list[int]:
    """The tokens the session route generates for `prompt` with these fields."""
    status, created = server.request("POST", "/v1/sessions", {"tokens": prompt})
    assert status == 201, created
    status, out = server.request("POST", f"/v1/sessions/{created['session_id']}/generate", body)
    assert status == 200, out
    server.request("DELETE", f"/v1/sessions/{created['session_id']}")
    return out["tokens"]


def test_penalties_answer_what_the_library_answers_with_them(server, chat_model):
    model = Model(str(chat_model))
    plain = local(chat_model, PROMPT, 24)
    client = server.client()
    for fields, engine in [({"frequency_penalty": 1.5, "presence_penalty": 0.5},
                            {"frequency_penalty": 1.5, "presence_penalty": 0.5}),
                           ({"extra_body": {"repeat_penalty": 3.0, "repeat_last_n": 32}},
                            {"repeat_penalty": 3.0, "repeat_last_n": 32})]:
        expected = local(chat_model, PROMPT, 24, **engine)
        assert expected != plain
        out = client.completions.create(model="m", prompt=PROMPT, max_tokens=24, **fields)
        assert out.choices[0].text == model.detokenize(expected)
        body = {"max_tokens": 24, **fields.get("extra_body", fields)}
        assert session_tokens(server, body) == expected


def test_a_biased_token_never_appears_and_the_rest_is_the_librarys_answer(server, chat_model):
    plain = session_tokens(server, {"max_tokens": 16})
    banned = sorted(set(plain[:6]))
    bias = {str(t): -100 for t in banned}
    assert not set(session_tokens(server, {"max_tokens": 16, "logit_bias": bias})) & set(banned)
    for seed in range(3):  # sampled, at a high temperature, too
        sampled = session_tokens(server, {"max_tokens": 16, "logit_bias": bias, "temperature": 1.5, "seed": seed})
        assert not set(sampled) & set(banned)
    expected = local(chat_model, PROMPT, 16, logit_bias={t: -100 for t in banned})
    out = server.client().completions.create(model="m", prompt=PROMPT, max_tokens=16, logit_bias=bias)
    assert out.choices[0].text == Model(str(chat_model)).detokenize(expected)
    # chat: the bias applies to the reply, the same tokens as a generation from the rendered prompt
    client = server.client()
    rendered = _rendered(server)
    first = session_tokens(server, {"max_tokens": 8}, rendered)[0]
    reply = client.chat.completions.create(model="m", messages=ASK, max_tokens=8, logit_bias={str(first): -100})
    expected = session_tokens(server, {"max_tokens": 8, "logit_bias": {str(first): -100}}, rendered)
    # (detokenize drops the first piece's leading space, which the reply's text keeps)
    assert expected[0] != first
    assert reply.choices[0].message.content.lstrip() == Model(str(chat_model)).detokenize(expected)


def _rendered(server: Server) -> list[int]:
    text = "<|im_start|>user\nthe capital of france is<|im_end|>\n<|im_start|>assistant\n"
    status, out = server.request("POST", "/v1/tokenize", {"text": text, "special": True})
    assert status == 200, out
    return out["tokens"]


def test_fields_that_change_nothing_are_accepted_and_change_nothing(server):
    client = server.client()
    plain = client.chat.completions.create(model="m", messages=ASK, max_tokens=6)
    tagged = client.chat.completions.create(model="m", messages=ASK, max_tokens=6, user="u-1", metadata={"k": "v"},
                                            store=False, service_tier="auto", modalities=["text"],
                                            extra_body={"safety_identifier": "s", "prompt_cache_key": "agent-1"})
    assert tagged.choices[0].message.content == plain.choices[0].message.content
    completion = client.completions.create(model="m", prompt=PROMPT, max_tokens=4, user="u-1", best_of=1)
    assert completion.choices[0].text == client.completions.create(model="m", prompt=PROMPT, max_tokens=4).choices[0].text
    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0).messages
    reply = messages.create(model="m", max_tokens=6, messages=ASK, metadata={"user_id": "u-1"}, service_tier="auto",
                            cache_control={"type": "ephemeral"}, inference_geo="eu")
    assert reply.content[0].text == plain.choices[0].message.content


@pytest.mark.parametrize("route, fields, where", [
    ("chat", {"extra_body": {"mirostat": 2}}, "body.mirostat"),
    ("chat", {"extra_body": {"temprature": 0.5}}, "body.temprature"),
    ("chat", {"reasoning_effort": "high"}, "body.reasoning_effort"),
    ("chat", {"modalities": ["text", "audio"]}, "body.modalities"),
    ("chat", {"frequency_penalty": 2.5}, "body.frequency_penalty"),
    ("chat", {"presence_penalty": -3}, "body.presence_penalty"),
    ("chat", {"logit_bias": {"hello": 1}}, "body.logit_bias"),
    ("chat", {"logit_bias": {"5": 101}}, "body.logit_bias"),
    ("completions", {"suffix": "end"}, "body.suffix"),
    ("completions", {"best_of": 3}, "body.best_of"),
    ("completions", {"extra_body": {"repeat_penalty": 0}}, "body.repeat_penalty"),
    ("completions", {"extra_body": {"repeat_last_n": -1}}, "body.repeat_last_n"),
    ("completions", {"logit_bias": {"1000000": -100}}, "logit_bias: token 1000000 is not a token id of this model"),
    ("chat", {"extra_body": {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}},
     "give grammar or response_format, not both"),
])
def test_a_field_that_would_change_the_answer_is_honoured_or_refused_naming_it(server, route, fields, where):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as refused:
        if route == "chat":
            client.chat.completions.create(model="m", messages=ASK, max_tokens=4, **fields)
        else:
            client.completions.create(model="m", prompt=PROMPT, max_tokens=4, **fields)
    assert where in refused.value.message, refused.value.message
    assert server.request("GET", "/health")[0] == 200


def test_unknown_fields_are_refused_on_every_route(server):
    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0).messages
    # (Anthropic's thinking is taken: tests/test_serve_anthropic_thinking.py; llama-server's reasoning budget is not)
    with pytest.raises(anthropic.BadRequestError,
                       match="body.reasoning_budget_tokens: this server does not take this field"):
        messages.create(model="m", max_tokens=4, messages=ASK, extra_body={"reasoning_budget_tokens": 1024})
    with pytest.raises(anthropic.BadRequestError, match="body.frequency_penalty"):
        messages.create(model="m", max_tokens=4, messages=ASK, extra_body={"frequency_penalty": 1})
    with pytest.raises(anthropic.BadRequestError, match="body.mcp_servers"):
        messages.count_tokens(model="m", messages=ASK, extra_body={"mcp_servers": []})
    status, created = server.request("POST", "/v1/sessions", {"tokens": PROMPT})
    status, out = server.request("POST", f"/v1/sessions/{created['session_id']}/generate",
                                 {"max_tokens": 2, "n_probs": 3})
    assert status == 400 and "body.n_probs: this server does not take this field" in out["error"]["message"]
    status, out = server.request("POST", "/v1/tokenize", {"text": "x", "add_special": True})
    assert status == 400 and "body.add_special: this server does not take this field" in out["error"]["message"]


def test_grammar_is_honoured_on_the_openai_routes(server):
    client = server.client()
    out = client.completions.create(model="m", prompt=PROMPT, max_tokens=8, extra_body={"grammar": 'root ::= "paris"'})
    assert out.choices[0].text == "paris" and out.choices[0].finish_reason == "stop"
    reply = client.chat.completions.create(model="m", messages=ASK, max_tokens=8,
                                           extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert reply.choices[0].message.content in ("yes", "no")
