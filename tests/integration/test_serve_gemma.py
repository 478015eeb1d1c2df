"""The server on the real model: a multi-turn chat through a warm server (reusing each turn's
prefix) gives, turn by turn, the answers of a cold start; chat streaming; JSON output."""
from __future__ import annotations

import concurrent.futures
import json
import socket
import time

import anthropic
import pytest

from test_serve import N_CTX, start_server, stop_server

from pyllamaopt import ChatTemplate, Context

pytestmark = pytest.mark.integration

SYSTEM = ("You are a concise assistant for a Python project. The project has these modules: "
          + ", ".join(f"mathkit/op_{i}.py" for i in range(40)) + ".")
QUESTIONS = ["What is a Python module?", "Name one of the project's modules.", "What does pytest do?"]


@pytest.fixture(scope="module")
def warm(gemma_path, tmp_path_factory):
    s = start_server(gemma_path, tmp_path_factory.mktemp("warm"))
    yield s
    stop_server(s)


def test_a_conversation_through_a_warm_server_equals_a_cold_start_turn_by_turn(warm, gemma):
    client = warm.client()
    messages = [{"role": "system", "content": SYSTEM}]
    turns = []
    previous_prompt = 0
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        reply = client.chat.completions.create(model="gemma", messages=messages, max_tokens=24)
        turns.append((list(messages), reply.choices[0].message.content))
        usage = reply.usage
        assert usage.prompt_tokens > 128
        # every complete 64-token block of the previous prompt is reused, but the one the last
        # chunk may need (the canonical schedule computes at least min_chunk tokens at the end)
        assert usage.prompt_tokens_details.cached_tokens >= previous_prompt // 64 * 64 - 64
        assert reply.model_extra["pyllamaopt"]["computed_tokens"] + usage.prompt_tokens_details.cached_tokens \
            == usage.prompt_tokens
        previous_prompt = usage.prompt_tokens
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    # the reference: each turn alone on a fresh context of its own (nothing to reuse), rendered
    # and tokenized as the server does
    template = ChatTemplate.for_model(gemma)
    for sent, answer in turns:
        with Context(gemma, n_ctx=N_CTX, n_threads=2) as ctx:
            session = ctx.session()
            session.append(gemma.tokenize(template.render(sent), add_bos=False, special=True))
            assert session.generate_text(24) == answer


def test_chat_streaming_equals_not_streaming(warm):
    client = warm.client()
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    whole = client.chat.completions.create(model="gemma", messages=messages, max_tokens=20)
    chunks = list(client.chat.completions.create(model="gemma", messages=messages, max_tokens=20, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_a_developer_message_is_a_system_message(warm):
    """OpenAI's newer name for the system role: Gemma's turns have no such role."""
    client = warm.client()
    ask = {"role": "user", "content": "Name a colour."}
    as_developer = client.chat.completions.create(
        model="gemma", messages=[{"role": "developer", "content": "Answer in one word."}, ask], max_tokens=8)
    as_system = client.chat.completions.create(
        model="gemma", messages=[{"role": "system", "content": "Answer in one word."}, ask], max_tokens=8)
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens


def test_json_schema_output_is_an_instance(warm):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = warm.client().chat.completions.create(
        model="gemma", max_tokens=60, messages=[{"role": "user", "content": "Invent a person, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert reply.choices[0].finish_reason == "stop"
    person = json.loads(reply.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int) and 0 <= person["age"] <= 150


def test_response_format_strict_has_openais_meaning(warm):
    """strict true: every constraint enforced by the grammar, or a 400 naming the one that cannot
    be; strict false or absent: what can be enforced is, and pyllamaopt.schema_valid says whether
    the output is valid against the whole schema."""
    import jsonschema
    import openai

    tags = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                      "minItems": 2, "maxItems": 3, "uniqueItems": True}},
            "required": ["tags"], "additionalProperties": False}
    ask = dict(model="gemma", max_tokens=40, messages=[{"role": "user", "content": "Give two or three colour tags as JSON."}])
    client = warm.client()
    with pytest.raises(openai.BadRequestError, match="uniqueItems"):
        client.chat.completions.create(**ask, response_format={
            "type": "json_schema", "json_schema": {"name": "tags", "schema": tags, "strict": True}})
    for spec in ({"name": "tags", "schema": tags, "strict": False}, {"name": "tags", "schema": tags}):
        reply = client.chat.completions.create(**ask, response_format={"type": "json_schema", "json_schema": spec})
        extension = reply.model_extra["pyllamaopt"]
        try:
            jsonschema.validate(json.loads(reply.choices[0].message.content), tags)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        assert extension["schema_valid"] is valid and (extension["schema_error"] is None) == valid, reply
        if valid is False and reply.choices[0].finish_reason == "stop":
            assert "non-unique" in extension["schema_error"]  # only what the grammar left out can fail
    exact = {**tags, "properties": {"tags": {**tags["properties"]["tags"], "uniqueItems": False}}}
    strict = {"type": "json_schema", "json_schema": {"name": "tags", "schema": exact, "strict": True}}
    reply = client.chat.completions.create(**ask, response_format=strict)
    assert reply.choices[0].finish_reason == "stop" and reply.model_extra["pyllamaopt"]["schema_valid"] is True
    chunks = list(client.chat.completions.create(**ask, response_format=strict, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reply.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].model_extra["pyllamaopt"]["schema_valid"] is True


def test_anthropic_messages_streaming_and_not_with_a_stop_sequence(warm):
    client = anthropic.Anthropic(base_url=warm.url, api_key="unused", max_retries=0)
    ask = dict(model="gemma", max_tokens=40, system="Answer with a numbered list.",
               messages=[{"role": "user", "content": [{"type": "text", "text": "Name three fruits."}]}])
    whole = client.messages.create(**ask)
    text = whole.content[0].text
    assert whole.stop_reason in ("end_turn", "max_tokens") and text
    counters = whole.model_extra["pyllamaopt"]
    assert whole.usage.output_tokens == counters["completion_tokens"] > 0
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == counters["prompt_tokens"] > 0
    with client.messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text and final.stop_reason == whole.stop_reason
    # a stop sequence taken from the answer itself ends it there, and is reported
    stop = text.split()[1]
    cut = client.messages.create(**ask, stop_sequences=["no such text", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[:text.index(stop)]


def test_concurrent_chats_get_the_answers_they_get_alone(warm):
    """Decode steps of concurrent generations share batches (patches/0006, 0007): same answers."""
    asks = [[{"role": "user", "content": f"Write one sentence about the number {n}."}] for n in range(4)]

    def ask(messages: list) -> str:
        return warm.client().chat.completions.create(model="gemma", messages=messages, max_tokens=24) \
            .choices[0].message.content

    alone = [ask(m) for m in asks]
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(ask, asks))
    assert together == alone


def test_a_client_gone_before_a_whole_answer_ends_its_generation(warm):
    """A response that is not streamed: once its client has gone, the server stops computing (it went
    on with every token of an answer nobody waited for: seconds of both cores, other clients
    queued behind it). The grammar makes the answer 900 tokens long unless it is cut."""
    prompt = warm.request("POST", "/v1/tokenize", {"text": "Once upon a time", "add_bos": True})[1]["tokens"]
    sid = warm.request("POST", "/v1/sessions", {"tokens": prompt})[1]["session_id"]
    body = json.dumps({"max_tokens": 900, "grammar": "root ::= x{100}\nx ::= [ab]{100}"}).encode()
    host, port = warm.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"POST /v1/sessions/{sid}/generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(1.0)  # generating; then the connection closes, no answer read
    deadline = time.monotonic() + 120
    while (info := warm.request("GET", f"/v1/sessions/{sid}")[1])["generating"] and time.monotonic() < deadline:
        time.sleep(0.1)
    generated = len(info["tokens"]) - len(prompt)
    assert 0 < generated < 900, f"{generated} tokens generated for a client that left after 1 s"
    # the session is usable, and goes on from where the generation stopped
    status, out = warm.request("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 3, "grammar": "root ::= [ab]+"})
    assert status == 200 and len(out["tokens"]) == 3
    assert warm.request("DELETE", f"/v1/sessions/{sid}")[0] == 204
