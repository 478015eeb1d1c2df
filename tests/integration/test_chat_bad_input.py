"""Bad chat input through the real `openai` client against a real server process (issue 44): a
template file that raises for a conversation is a 400 naming the file and the line, streamed or not,
and the server goes on serving; a native call the model breaks off (cut by max_tokens, or ended by a
stop string inside it) reaches the client as text, never as a call, its finish_reason the cut's and
the answer's pyllamaopt.malformed_call saying why. The model: Qwen2.5-Coder 0.5B, which writes its
calls as bare JSON, without the `<tool_call>` tags its template asks for (llama.cpp's parser, as ours,
then reads them as text), served with its template without those tags: a native format llama.cpp's
chat layer derives from the template, and the model's calls parse."""
from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from test_chat_templates import RAISING
from test_serve import Server, start_server, stop_server
from test_serve_tools import ASK, TOOLS
from upstream_programs import templates_dir

pytestmark = pytest.mark.integration


def test_a_template_that_raises_is_a_400_naming_the_file_and_line(tiny_model_path, tmp_path):
    path = tmp_path / "strict.jinja"
    path.write_text(RAISING)
    server = start_server(tiny_model_path, tmp_path, "--chat-template-file", str(path))
    try:
        client = server.client()
        forbidden = [{"role": "user", "content": "a forbidden word"}]
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="m", messages=forbidden, max_tokens=2, stream=stream)
            message = str(caught.value)
            assert f"chat template {path} failed to render: line 3" in message, message
            assert "no forbidden messages here" in message
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def qwen(qwen_path, tmp_path_factory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("qwen-bad-input")
    source = (templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    for tagged, bare in ((""" within <tool_call></tool_call> XML tags:\\n<tool_call>\\n""", ":\\n"),
                         ("""}\\n</tool_call><|im_end|>""", "}<|im_end|>"),
                         ("""'\\n<tool_call>\\n{"name": "'""", """'\\n{"name": "'"""), ("""'}\\n</tool_call>'""", "'}'")):
        assert tagged in source
        source = source.replace(tagged, bare)
    (folder / "bare-calls.jinja").write_text(source)
    server = start_server(qwen_path, folder, "--chat-template-file", str(folder / "bare-calls.jinja"))
    yield server
    stop_server(server)


def test_a_call_the_model_breaks_off_is_text_with_the_reason(qwen):
    client = qwen.client()
    whole = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=80)
    assert whole.choices[0].finish_reason == "tool_calls", whole  # (greedy)
    [call] = whole.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    # the same reply cut six tokens before its end: inside the call's arguments
    cut_at = whole.usage.completion_tokens - 6
    cut = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=cut_at)
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content.startswith('{"name": "get_weather", "arguments": {')
    assert cut.model_extra["pyllamaopt"]["malformed_call"]
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=cut_at,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == choice.message.content
    assert not any(d.tool_calls for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["pyllamaopt"]["malformed_call"]
    # ended inside the call by a stop string: not a cut; the reason says why it is text
    stopped = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=80, stop=['"unit"'])
    choice = stopped.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content.startswith('{"name": "get_weather"') and '"unit"' not in choice.message.content
    assert stopped.model_extra["pyllamaopt"]["malformed_call"]
