"""Tool calling through the server on real models (SmolLM2 135M Instruct: a ChatML template;
Gemma 3 270M: the built-in Gemma turns), with the real `openai` and `anthropic` clients: calls
valid against their tools' schemas for every tool_choice, streaming equal to not streaming, a
round trip (call, result, answer) whose second request reuses the first's KV, and bad input
refused with a 4xx while the server lives on."""
from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import openai
import pytest

from test_serve import Server, start_server, stop_server

pytestmark = pytest.mark.integration

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "The sum of two integers",
                                           "parameters": ADD}}]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]
ASK = [{"role": "system", "content": "You are a helpful assistant."},
       {"role": "user", "content": "What is the weather in Paris?"}]
# long enough that the second turn's new tokens fill more than the last chunk the schedule computes
RESULT = ("Sunny, 21 degrees, light wind from the west at 10 km/h, humidity 40 percent, no rain expected today or "
          "tomorrow; sunrise at 06:12 and sunset at 21:40. Air quality is good and the UV index is moderate.")


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def served(request, tmp_path_factory) -> Any:
    s = start_server(request.getfixturevalue(f"{request.param}_path"), tmp_path_factory.mktemp(request.param))
    yield s
    stop_server(s)


def valid_arguments(name: str, arguments: str | dict) -> dict:
    """The arguments, checked against the tool's schema (the keywords these tools use)."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    schema = SCHEMAS[name]
    assert isinstance(args, dict) and set(schema["required"]) <= set(args) <= set(schema["properties"]), args
    for key, value in args.items():
        rule = schema["properties"][key]
        if "enum" in rule:
            assert value in rule["enum"], (key, value)
        elif rule["type"] == "integer":
            assert isinstance(value, int) and not isinstance(value, bool), (key, value)
        else:
            assert isinstance(value, str) and len(value) <= rule["maxLength"], (key, value)
    return args


def one_call(reply: Any, name: str | None = None) -> Any:
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id) and call.type == "function"
    assert name in (None, call.function.name) and call.function.name in SCHEMAS
    valid_arguments(call.function.name, call.function.arguments)
    return call


def test_required_and_a_named_function_give_a_call_valid_against_its_schema(served):
    client = served.client()
    one_call(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                            parallel_tool_calls=False, max_tokens=60))
    for name in SCHEMAS:
        one_call(client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": name}},
            parallel_tool_calls=False, max_tokens=60), name)


def test_parallel_calls_are_each_valid(served):
    """parallel_tool_calls defaults to true: a small model may make several calls (and be cut by
    max_tokens in the last one)."""
    reply = served.client().chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                                    max_tokens=80)
    choice = reply.choices[0]
    calls = choice.message.tool_calls
    assert calls and len({c.id for c in calls}) == len(calls)
    whole = calls if choice.finish_reason == "tool_calls" else calls[:-1]
    assert choice.finish_reason in ("tool_calls", "length")
    for call in whole:
        valid_arguments(call.function.name, call.function.arguments)


def test_a_repeated_call_ends_the_reply_streamed_or_not(served, request):
    """Without max_tokens SmolLM2 repeated its call until the context was full (116 times): a reply's
    calls are distinct, the first repeat ends it, and a stream never sends any part of it."""
    ask = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required")
    client = served.client()
    reply = client.chat.completions.create(**ask)
    choice = reply.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert choice.finish_reason == "tool_calls" and len(set(calls)) == len(calls)
    for name, arguments in calls:
        valid_arguments(name, arguments)
    assert reply.usage.completion_tokens < 60 * (len(calls) + 1)  # it stopped: no call takes 60 tokens
    streamed: dict[int, list[str]] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **ask):
        for delta in chunk.choices[0].delta.tool_calls or []:
            streamed.setdefault(delta.index, [delta.function.name, ""])[1] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and [tuple(c) for c in streamed.values()] == calls
    if request.node.callspec.params["served"] != "smollm2":
        return  # (Gemma 3 makes distinct calls here: nothing repeats)
    # cut one token before the repeat's end (its closing brace): the repeat is recognised all the same
    cut = client.chat.completions.create(max_tokens=reply.usage.completion_tokens - 1, **ask).choices[0]
    assert [(c.function.name, c.function.arguments) for c in cut.message.tool_calls] == calls
    streamed = {}
    for chunk in client.chat.completions.create(stream=True, max_tokens=reply.usage.completion_tokens - 1, **ask):
        for delta in chunk.choices[0].delta.tool_calls or []:
            streamed.setdefault(delta.index, [delta.function.name, ""])[1] += delta.function.arguments or ""
    assert [tuple(c) for c in streamed.values()] == calls
    message = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0).messages.create(
        model="m", max_tokens=4096, messages=ASK[1:], system=ASK[0]["content"], tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "any"})
    assert message.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in message.content] == [("tool_use", n, json.loads(a)) for n, a in calls]


def test_stop_strings_of_a_tool_reply_cut_the_answers_text(served):
    """With tools the reply is JSON, and stop strings matched its text: an answer's newline never
    (an escape there). They apply to the answer's decoded text: cut before the stop string, streamed
    or not, on both surfaces, finish reason stop / stop_sequence."""
    question = [ASK[0], {"role": "user", "content": "Say hello to me."}]
    ask = dict(model="m", messages=question, tools=TOOLS, tool_choice="none", max_tokens=40)
    client = served.client()
    whole = client.chat.completions.create(**ask).choices[0].message.content
    assert len(whole) >= 8, whole
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]  # cut about half way
    expected = whole[:whole.index(stop)]
    cut = client.chat.completions.create(stop=[stop], **ask).choices[0]
    assert (cut.message.content, cut.finish_reason) == (expected, "stop")
    # the JSON's own text is not the answer's (it cut every answer at once: '{"response":"')
    assert client.chat.completions.create(stop=['{"', '":"'], **ask).choices[0].message.content == whole
    chunks = list(client.chat.completions.create(stop=[stop], stream=True, **ask))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    claude = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    message = claude.messages.create(model="m", max_tokens=40, system=ASK[0]["content"], messages=question[1:],
                                     tools=ANTHROPIC_TOOLS, tool_choice={"type": "none"}, stop_sequences=[stop])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)
    assert [b.text for b in message.content] == [expected]


def test_anthropic_count_tokens_counts_the_prompt_messages_answers(served):
    """POST /v1/messages/count_tokens (the SDK's messages.count_tokens; agents call it to budget their
    context) was a 404 in OpenAI's error shape: the prompt's tokens, as /v1/messages renders them."""
    claude = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    for extra in ({}, {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"}}):
        ask = dict(model="m", system=ASK[0]["content"], messages=ASK[1:], **extra)
        counted = claude.messages.count_tokens(**ask).input_tokens
        usage = claude.messages.create(max_tokens=1, **ask).usage
        assert counted == usage.input_tokens + usage.cache_read_input_tokens > 0
    with pytest.raises(anthropic.BadRequestError, match="messages"):  # the API's own error shape
        claude.messages.count_tokens(model="m", messages=[])


def test_auto_gives_a_valid_call_or_text_and_none_gives_text(served):
    client = served.client()
    for question in ("What is the weather in Paris?", "Say hello to me."):
        reply = client.chat.completions.create(model="m", tools=TOOLS, max_tokens=40, parallel_tool_calls=False,
                                               messages=[{"role": "user", "content": question}])
        choice = reply.choices[0]
        if choice.message.tool_calls:
            one_call(reply)
        else:
            assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    reply = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=30)
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length") and not choice.message.content.startswith('{"response"')


def round_trip(client: openai.OpenAI, **second: Any) -> tuple[Any, Any]:
    """A required call, then the request that sends its result back."""
    first = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=60)
    call = one_call(first)
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    return first, client.chat.completions.create(model="m", messages=history, tools=TOOLS, **second)


def test_a_round_trip_reuses_the_first_turns_prompt(served):
    """Call, result, answer: the second request's prompt starts with the first's prompt and answer
    (rendered as the exact text the model wrote), so all of the first prompt's KV is reused; the
    answer's own tokens are computed again, as exact mode does for every generated token
    (docs/exactness.md)."""
    first, second = round_trip(served.client(), tool_choice="none", max_tokens=30)
    assert isinstance(second.choices[0].message.content, str)
    before, after = first.usage, second.usage
    assert after.prompt_tokens > before.prompt_tokens + before.completion_tokens
    # all of the first prompt but the chunk alignment (multiples of 4 tokens) of its end
    assert after.prompt_tokens_details.cached_tokens >= before.prompt_tokens - 4
    computed = second.model_extra["pyllamaopt"]["computed_tokens"]
    assert computed + after.prompt_tokens_details.cached_tokens == after.prompt_tokens
    assert computed <= after.prompt_tokens - before.prompt_tokens + 4


def test_with_generated_tokens_kept_the_round_trip_reuses_the_answer_too(smollm2_path, tmp_path):
    """With the Tier-2 option that keeps generated tokens' KV, the second request reuses the first
    answer's KV as well: the rendered call is the text the model wrote, and its tokens are the
    model's but for the last few (where SmolLM2 spelled `"}}]}` in other tokens than the
    tokenizer does). Not on Gemma 3: under the grammar it spells `{"` as `{` `"` from the start."""
    s = start_server(smollm2_path, tmp_path, env={"LLAMA_OPT_DIFF_REUSE_GENERATED": "1"})
    try:
        first, second = round_trip(s.client(), max_tokens=20)
        reused = second.usage.prompt_tokens_details.cached_tokens
        assert reused >= first.usage.prompt_tokens + first.usage.completion_tokens - 8
        assert second.model_extra["pyllamaopt"]["approximate"]
    finally:
        stop_server(s)


def test_openai_streaming_gives_the_call_of_not_streaming(served):
    client = served.client()
    ask = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=60)
    whole = one_call(client.chat.completions.create(**ask))
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    chunks = list(client.chat.completions.create(stream=True, **ask))
    assert chunks[0].choices[0].delta.role == "assistant"
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": delta.id, "name": delta.function.name, "arguments": ""})
            call["arguments"] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
        assert not chunk.choices[0].delta.content
    assert finish == "tool_calls"
    [streamed] = calls.values()
    assert re.fullmatch(r"call_[0-9a-f]{24}", streamed["id"])
    assert (streamed["name"], streamed["arguments"]) == (whole.function.name, whole.function.arguments)
    # the client's own accumulation
    with client.chat.completions.stream(**ask) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == (whole.function.name, whole.function.arguments)
    assert final.choices[0].finish_reason == "tool_calls"


def test_openai_streaming_of_a_text_answer(served):
    client = served.client()
    ask = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=20)
    whole = client.chat.completions.create(**ask).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **ask))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_anthropic_tool_use_streaming_and_not_and_a_tool_result(served):
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    ask = dict(model="m", max_tokens=60, system="You are a helpful assistant.", tools=ANTHROPIC_TOOLS,
               tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
               messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    whole = client.messages.create(**ask)
    assert whole.stop_reason == "tool_use"
    [block] = whole.content
    assert block.type == "tool_use" and block.name == "get_weather" and re.fullmatch(r"toolu_[0-9a-f]{24}", block.id)
    valid_arguments(block.name, block.input)
    with client.messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[1].content_block.type == "tool_use" and events[1].content_block.input == {}
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert json.loads(partial) == block.input
    assert final.stop_reason == "tool_use" and [(b.name, b.input) for b in final.content] == [(block.name, block.input)]
    # cut inside the call by max_tokens: the same input streamed (the SDK reads the partial JSON) and not
    # (it was {} not streamed)
    cut_inputs = []
    for cut in range(whole.usage.output_tokens - 6, whole.usage.output_tokens):
        short = {**ask, "max_tokens": cut}
        with client.messages.stream(**short) as stream:
            streamed = stream.get_final_message()
        plain = client.messages.create(**short)
        assert plain.stop_reason == streamed.stop_reason
        assert ([(b.type, b.name, b.input) for b in plain.content] ==
                [(b.type, b.name, b.input) for b in streamed.content])
        if plain.stop_reason == "max_tokens":
            cut_inputs += [b.input for b in plain.content if b.input != block.input]
    assert cut_inputs and all(cut_inputs)  # cut calls were among them, each with a part of its input
    # the result goes back as a tool_result block; the answer is text
    history = ask["messages"] + [
        {"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"}) for b in whole.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id,
                                      "content": [{"type": "text", "text": RESULT}]}]}]
    answer = client.messages.create(**{**ask, "tool_choice": {"type": "none"}, "messages": history, "max_tokens": 20})
    assert [b.type for b in answer.content] == ["text"] and answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.usage.cache_read_input_tokens >= whole.model_extra["pyllamaopt"]["prompt_tokens"] - 4


OPENAI_BAD = [
    ({"tools": {"type": "function"}}, "body.tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "body.tools.0.function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}}, "not among the tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "body.tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "grep", "parameters": {  # a lookahead: no grammar
        "type": "object", "properties": {"pattern": {"type": "string", "pattern": "^(?=a)a+$"}}}}}]},
     "tools[0] (grep): its parameters cannot be used"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format cannot be combined with tools"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{a: 1}"}}]}]},
     "messages[2].tool_calls[0].function.arguments is not JSON"),
    ({"messages": ASK + [{"role": "tool", "tool_call_id": "call_1", "content": "3"}]},
     "a tool result for call 'call_1', but no earlier assistant message made that call"),
    ({"messages": ASK + [{"role": "tool", "content": "3"}]}, "needs the 'tool_call_id'"),
    # arguments JSON cannot read (they raised ValueError / RecursionError: a text/plain 500, retried by the clients)
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": ' + "9" * 5000 + "}"}}]}]},
     "is not JSON we can read"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "[" * 5000 + "]" * 5000}}]}]},
     "is not JSON we can read"),
]
ANTHROPIC_BAD = [
    ({"tools": "get_weather"}, "body.tools"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "one of Anthropic's server tools"),
    ({"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool"}}, "needs the tool's 'name'"),
    ({"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "rm"}}, "not among the tools"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}]}]},
     "no earlier assistant message made that call"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": "a=1"}]}]}, "'input' (an object)"),
] + [  # a tool_result whose content is neither a string nor a list of blocks (a TypeError / AttributeError: a 500)
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]}]}, message)
    for content, message in [(5, "must be a string or a list of content blocks"),
                             (["x"], "content parts must be of type 'text' (got 'str')"),
                             ({"type": "text", "text": "3"}, "must be a string or a list of content blocks")]
]


@pytest.mark.parametrize("change, message", OPENAI_BAD)
def test_bad_openai_tool_input_is_a_400_and_the_server_lives_on(served, change, message):
    check_refused(served, "/v1/chat/completions", {"model": "m", "messages": ASK, "max_tokens": 5, **change},
                  message, lambda out: out["error"]["message"])


@pytest.mark.parametrize("change, message", ANTHROPIC_BAD)
def test_bad_anthropic_tool_input_is_a_400_and_the_server_lives_on(served, change, message):
    check_refused(served, "/v1/messages", {"model": "m", "max_tokens": 5, "tools": ANTHROPIC_TOOLS,
                                           "messages": [{"role": "user", "content": "hi"}], **change},
                  message, lambda out: out["error"]["message"] if out.get("type") == "error" else "")


def check_refused(server: Server, path: str, body: dict, message: str, text_of: Any) -> None:
    status, out = server.request("POST", path, body)
    assert status == 400, out
    assert message in text_of(out), out
    assert server.request("GET", "/health")[0] == 200


def test_the_clients_raise_their_bad_request_errors(served):
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        served.client().chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=5,
                                                tool_choice={"type": "function", "function": {"name": "rm"}})
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="cannot be used"):
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                               tools=[{"name": "grep", "input_schema": {
                                   "type": "object", "properties": {"p": {"type": "string", "pattern": "(?=a)a+"}}}}])


def test_sparse_tool_results_marks_exactly_the_results_on_the_real_tokenizers(smollm2_path, gemma_path, tmp_path):
    """--sparse-tool-results (Tier 2): the marks are exactly the tokens of each result's content
    as the prompt spells it (JSON-escaped) on both tokenizers, and through the server a long result
    loses spans (the budget: half of it) and the answer says it is approximate."""
    from pyllamaopt import ChatTemplate, Model
    from pyllamaopt.serve.chat_messages import Tool, ToolCall, ToolChoice, ToolResult, Turn
    from pyllamaopt.serve.chat_prompt import prompt_tokens, render_prompt
    from pyllamaopt.serve.params import GenerateParams

    log = "".join(f"step {i}: loss {1 / (i + 1):.4f} \"ok\"\n" for i in range(60)) + "Traceback: ValueError ünï"
    for path in (smollm2_path, gemma_path):
        model = Model(path)
        turns = [Turn("user", "Why did it fail?"), Turn("assistant", calls=[ToolCall("call_1", "read", '{"path":"log"}')]),
                 Turn("user", "and?", results=[ToolResult("call_1", log)])]
        marked = render_prompt(ChatTemplate.for_model(model), turns, [Tool("read", None, {"type": "object"})], ToolChoice(),
                        GenerateParams(), mark_tool_results=True)
        tokens, [(a, b)] = prompt_tokens(model, marked)
        spelled = b"".join(model.token_bytes(t, special=True) for t in tokens[a:b]).decode()
        assert spelled == json.dumps(log, ensure_ascii=False)[1:-1]
    s = start_server(smollm2_path, tmp_path, "--sparse-tool-results", "--n-ctx", "4096", env={"LLAMA_OPT_SPARSE_ATTN_BUDGET": "0.5"})
    try:
        messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                          "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"celsius"}'}}]},
                          {"role": "tool", "tool_call_id": "call_1", "content": log}]
        answer = s.client().chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=8)
        assert answer.model_extra["pyllamaopt"]["approximate"]
        assert s.metrics()["pyllamaopt_sparse_tokens_dropped_total"] > 0
    finally:
        stop_server(s)


def test_a_tool_without_parameters_is_called_with_none_and_anchor_references_resolve(served):
    """OpenAI: a function whose 'parameters' are omitted has an empty parameter list (the model
    invented arguments when it meant "any object"); a '$ref' to an '$anchor' in a tool's parameters
    resolves (it was rebased like a JSON pointer: a 400 naming a definition nobody wrote)."""
    client = served.client()
    clock = [{"type": "function", "function": {"name": "get_time", "description": "The current time"}}]
    reply = client.chat.completions.create(model="m", messages=ASK, tools=clock, max_tokens=40, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}},
                                           parallel_tool_calls=False)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments) == {}
    anchored = {"type": "object", "properties": {"city": {"$ref": "#city"}}, "required": ["city"],
                "$defs": {"City": {"$anchor": "city", "type": "string", "maxLength": 12}}}
    reply = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=60, temperature=0,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": anchored}}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False)
    (call,) = reply.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 12


def test_errors_outside_the_routes_have_the_protocols_shape(served):
    status, out = served.request("GET", "/v1/no-such-route")
    assert status == 404 and out["error"]["type"] == "not_found_error", out
    status, out = served.request("POST", "/v1/chat/completions", raw=b"[" * 3000 + b"]" * 3000)
    assert status in (400, 422) and "error" in out, out
