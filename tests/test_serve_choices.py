"""OpenAI's n on the tiny model, with the real `openai` client against a server process: n choices
are the answers of n requests of their own, choice i with seed + i (streamed or not, completions and
chat); the prompt is computed once, the forks computing only its last chunk; each choice
honours the request's logit bias, penalties and JSON Schema; n out of range is a 400 naming it."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from pyllamaopt import Context, Model
from test_serve import N_CTX, start_server, stop_server
from test_serve_fields import ASK, chat_model, local, server  # noqa: F401 (the fixtures: a server of a chat model)

BLOCK = 64  # the context's block size: a fork shares the prompt's complete blocks
PROMPT = list(range(10, 10 + 2 * BLOCK + 10))  # two complete blocks and 10 tokens
SAMPLED = {"temperature": 1.5, "seed": 7}


def library_text(model_path, prompt: list[int], max_tokens: int, **sampling: Any) -> str:
    """The library's text with these settings, as the server's: each token's piece (detokenize
    drops a first piece's leading space)."""
    with Context(Model(str(model_path)), n_ctx=N_CTX, n_threads=2) as ctx, ctx.session() as s:
        s.append(prompt)
        return s.generate_text(max_tokens, **sampling)


def streamed_texts(chunks: Iterator[Any], text_of: Any) -> tuple[dict[int, str], dict[int, str], list[Any]]:
    """A stream's text and finish reason per choice index, and its usage chunks."""
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    usages = []
    for chunk in chunks:
        if chunk.usage is not None:
            usages.append(chunk)
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (text_of(choice) or "")
            if choice.finish_reason is not None:
                assert choice.index not in finish, "a choice ends once"
                finish[choice.index] = choice.finish_reason
    return texts, finish, usages


def test_completions_choices_are_the_answers_of_separate_requests_with_seed_plus_i(server, chat_model):
    client = server.client()
    prompt = PROMPT[:90]
    together = client.completions.create(model="m", prompt=prompt, max_tokens=12, n=3, **SAMPLED)
    assert [c.index for c in together.choices] == [0, 1, 2]
    alone = [client.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=1.5, seed=7 + i)
             for i in range(3)]
    assert [c.text for c in together.choices] == [a.choices[0].text for a in alone]
    assert len({c.text for c in together.choices}) > 1, "seeds 7, 8, 9 sampled the same text"
    # the library's own answer, choice by choice
    for i, choice in enumerate(together.choices):
        assert choice.text == library_text(chat_model, prompt, 12, temperature=1.5, seed=7 + i)
    # streamed: the same texts, each choice's chunks carrying its index, the usage once at the end
    stream = client.completions.create(model="m", prompt=prompt, max_tokens=12, n=3, stream=True,
                                       stream_options={"include_usage": True}, **SAMPLED)
    texts, finish, usages = streamed_texts(iter(stream), lambda c: c.text)
    assert texts == {i: c.text for i, c in enumerate(together.choices)}
    assert finish == {0: "length", 1: "length", 2: "length"}
    assert len(usages) == 1 and usages[0].usage.completion_tokens == 36 == together.usage.completion_tokens
    assert together.usage.prompt_tokens == usages[0].usage.prompt_tokens == len(prompt)


def test_chat_choices_are_the_answers_of_separate_requests_with_seed_plus_i(server):
    client = server.client()
    together = client.chat.completions.create(model="m", messages=ASK, max_tokens=10, n=3, **SAMPLED)
    alone = [client.chat.completions.create(model="m", messages=ASK, max_tokens=10, temperature=1.5, seed=7 + i)
             for i in range(3)]
    assert [c.message.content for c in together.choices] == [a.choices[0].message.content for a in alone]
    assert [c.finish_reason for c in together.choices] == [a.choices[0].finish_reason for a in alone]
    assert [c.index for c in together.choices] == [0, 1, 2]
    stream = client.chat.completions.create(model="m", messages=ASK, max_tokens=10, n=3, stream=True,
                                            stream_options={"include_usage": True}, **SAMPLED)
    chunks = list(stream)
    texts, finish, usages = streamed_texts(iter(chunks), lambda c: c.delta.content)
    assert texts == {i: c.message.content for i, c in enumerate(together.choices)}
    assert finish == {i: c.finish_reason for i, c in enumerate(together.choices)}
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1, 2], "each choice's first delta says the role, once"
    assert usages[0].usage.completion_tokens == together.usage.completion_tokens


def test_without_a_seed_choices_differ_and_greedy_choices_are_the_same(server):
    client = server.client()
    sampled = client.completions.create(model="m", prompt=PROMPT[:40], max_tokens=12, n=4, temperature=1.5)
    assert len({c.text for c in sampled.choices}) > 1
    greedy = client.completions.create(model="m", prompt=PROMPT[:40], max_tokens=12, n=3)
    single = client.completions.create(model="m", prompt=PROMPT[:40], max_tokens=12)
    assert [c.text for c in greedy.choices] == [single.choices[0].text] * 3


def test_the_prompt_is_computed_once_each_fork_computes_only_its_last_chunk(chat_model, tmp_path):
    """A server of its own (its cache empty: no earlier answer's KV in the way of these): n=3
    computes the prompt once, and each of the two forks only the prompt's last chunk (a fork shares
    the blocks before it: those of a canonical chunk, the last chunk holding at least a block); the
    usage counts the prompt once, the metrics one prefill and three generations."""
    fresh = start_server(chat_model, tmp_path)
    try:
        client = fresh.client()
        before = fresh.metrics()
        out = client.completions.create(model="m", prompt=PROMPT, max_tokens=8, n=3, **SAMPLED)
        after = fresh.metrics()
        last_chunk = len(PROMPT) - (len(PROMPT) - BLOCK) // BLOCK * BLOCK  # 74: a block and 10 tokens
        extra = out.model_extra["pyllamaopt"]
        assert out.usage.prompt_tokens == len(PROMPT) and out.usage.completion_tokens == 24
        assert extra["computed_tokens"] == len(PROMPT) + 2 * last_chunk  # not 3 * len(PROMPT)
        assert out.usage.prompt_tokens_details.cached_tokens == 0
        computed = "pyllamaopt_prompt_tokens_computed_total"
        assert after[computed] - before[computed] == len(PROMPT) + 2 * last_chunk
        assert after["generate_prefill_tokens_count"] - before["generate_prefill_tokens_count"] == 1
        assert after["generate_prefill_tokens_sum"] - before["generate_prefill_tokens_sum"] == len(PROMPT)
        assert after["session_history_tokens_count"] - before["session_history_tokens_count"] == 3
        # the same prompt again: its blocks are cached; each choice computes at most its last chunk
        again = client.completions.create(model="m", prompt=PROMPT, max_tokens=8, n=3, **SAMPLED)
        assert again.model_extra["pyllamaopt"]["computed_tokens"] <= 3 * last_chunk
        assert [c.text for c in again.choices] == [c.text for c in out.choices]
    finally:
        stop_server(fresh)


def test_each_choice_honours_logit_bias_and_penalties(server, chat_model):
    client = server.client()
    prompt = PROMPT[:90]
    plain = [local(chat_model, prompt, 16, temperature=1.5, seed=7 + i) for i in range(3)]
    banned = sorted({t for tokens in plain for t in tokens[:4]})
    bias = {t: -100 for t in banned}
    out = client.completions.create(model="m", prompt=prompt, max_tokens=16, n=3,
                                    logit_bias={str(t): -100 for t in banned}, **SAMPLED)
    for i, choice in enumerate(out.choices):
        expected = local(chat_model, prompt, 16, temperature=1.5, seed=7 + i, logit_bias=bias)
        assert not set(expected) & set(banned)
        assert choice.text == library_text(chat_model, prompt, 16, temperature=1.5, seed=7 + i, logit_bias=bias)
    penalties = {"frequency_penalty": 1.5, "presence_penalty": 0.5}
    out = client.completions.create(model="m", prompt=prompt, max_tokens=24, n=2, **penalties, **SAMPLED)
    for i, choice in enumerate(out.choices):
        expected = library_text(chat_model, prompt, 24, temperature=1.5, seed=7 + i, **penalties)
        assert expected != library_text(chat_model, prompt, 24, temperature=1.5, seed=7 + i)
        assert choice.text == expected


def test_each_choice_is_held_to_the_json_schema(server):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "maybe"]}, "sure": {"type": "boolean"}},
              "required": ["answer", "sure"], "additionalProperties": False}
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    client = server.client()
    out = client.chat.completions.create(model="m", messages=ASK, max_tokens=80, n=3, response_format=response_format,
                                         **SAMPLED)
    for i, choice in enumerate(out.choices):
        jsonschema.validate(json.loads(choice.message.content), schema)
        # (each choice of a chat answer names its reply's format too, "none" without tools: issue 44)
        assert choice.model_extra["pyllamaopt"] == {"schema_valid": True, "schema_error": None, "tool_format": "none"}
        alone = client.chat.completions.create(model="m", messages=ASK, max_tokens=80, response_format=response_format,
                                               temperature=1.5, seed=7 + i)
        assert choice.message.content == alone.choices[0].message.content


@pytest.mark.parametrize("n", [0, 9, -1])
def test_n_out_of_range_is_a_400_naming_it(server, n):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="body.n"):
        client.completions.create(model="m", prompt=PROMPT[:10], max_tokens=2, n=n)
    with pytest.raises(openai.BadRequestError, match="body.n"):
        client.chat.completions.create(model="m", messages=ASK, max_tokens=2, n=n)


def test_the_most_choices_answered_or_left_mid_stream_leave_the_server_as_it_was(server):
    """n = 8 (the most), answered whole or left mid-stream, again and again: the forks' sequences
    come back (more than the server's 32 taken in all), the same answers each time."""
    client = server.client()
    first = client.completions.create(model="m", prompt=PROMPT[:70], max_tokens=4, n=8, **SAMPLED)
    assert len(first.choices) == 8 and first.usage.completion_tokens == 32
    for _ in range(4):
        with client.completions.create(model="m", prompt=PROMPT[:70], max_tokens=40, n=8, stream=True,
                                       **SAMPLED) as stream:
            next(iter(stream))  # then the client leaves
        again = client.completions.create(model="m", prompt=PROMPT[:70], max_tokens=4, n=8, **SAMPLED)
        assert [c.text for c in again.choices] == [c.text for c in first.choices]


def test_each_choice_carries_its_own_log_probabilities(server):
    """n with logprobs (and echo): each choice's lists are those of a request of its own with its
    seed, the echoed prompt's the same in every choice; chat's per choice too, streamed and not."""
    client = server.client()
    prompt = PROMPT[:90]
    together = client.completions.create(model="m", prompt=prompt, max_tokens=6, n=2, logprobs=2, echo=True, **SAMPLED)
    alone = [client.completions.create(model="m", prompt=prompt, max_tokens=6, logprobs=2, echo=True,
                                       temperature=1.5, seed=7 + i).choices[0] for i in range(2)]
    for choice, own in zip(together.choices, alone):
        assert choice.text == own.text
        assert choice.logprobs.tokens == own.logprobs.tokens
        assert choice.logprobs.token_logprobs == own.logprobs.token_logprobs
    assert together.choices[0].logprobs.token_logprobs[:len(prompt)] == \
        together.choices[1].logprobs.token_logprobs[:len(prompt)]
    messages = ASK
    chat = client.chat.completions.create(model="m", messages=messages, max_tokens=6, n=2, logprobs=True,
                                          top_logprobs=1, **SAMPLED)
    streamed: dict[int, list[float]] = {}
    for chunk in client.chat.completions.create(model="m", messages=messages, max_tokens=6, n=2, logprobs=True,
                                                top_logprobs=1, stream=True, **SAMPLED):
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content:
                streamed.setdefault(choice.index, []).extend(t.logprob for t in choice.logprobs.content)
    for choice in chat.choices:
        own = client.chat.completions.create(model="m", messages=messages, max_tokens=6, logprobs=True, top_logprobs=1,
                                             temperature=1.5, seed=7 + choice.index).choices[0]
        values = [t.logprob for t in choice.logprobs.content]
        assert values == [t.logprob for t in own.logprobs.content] == streamed[choice.index]
