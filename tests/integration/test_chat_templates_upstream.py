"""Chat templates rendered as llama.cpp renders them (issue 44). With the same template file,
`POST /apply-template` of our server and of llama-server (built from the pinned tree) give the same
prompt, byte for byte, for a conversation with tools, a call, its result, markup, non-ASCII text and
an assistant's reasoning sent back; and for every template of the pinned tree's models/templates/,
the prompt our chat routes compute (the request through our message model) is llama.cpp's rendering
of the request as it came (the binding), or both refuse it: a ChatTemplateError / 400 naming the
template."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyllamaopt import ChatTemplate, ChatTemplateError, Model
from pyllamaopt.serve.chat_prompt import render_prompt
from pyllamaopt.serve.errors import BadRequest
from pyllamaopt.serve.openai_routes import _tools, _turns
from pyllamaopt.serve.schemas import ChatCompletionRequest
from test_serve import N_CTX, Server, free_port, start_server, stop_server
from upstream_programs import build_program, templates_dir

pytestmark = pytest.mark.integration

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Das Wetter einer Stadt — «heute» & <morgen>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "z. B. Zürich, 東京"}},
                   "required": ["city"]}}}
SYSTEM = {"role": "system", "content": "Antworte knapp. Use <b>tags</b> & \"quotes\"."}
ASK = {"role": "user", "content": "Wie ist das Wetter in Zürich? <|im_end|> 東京は?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "abc123DEF", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "abc123DEF", "content": "Sonnig, 21 °C, <i>leichter</i> Wind"}
WITH_TOOLS = {"messages": [SYSTEM, ASK, CALL, RESULT], "tools": [WEATHER]}
THOUGHT = "Der Nutzer fragt nach dem Wetter in <Zürich> — erst nachsehen, dann antworten."

CONVERSATIONS = {
    "system": {"messages": [SYSTEM, ASK]},
    "multi-turn": {"messages": [SYSTEM, ASK, {"role": "assistant", "content": "Sonnig — 21 °C."},
                                {"role": "user", "content": "Und morgen? <tag>"}]},
    "tools": {"messages": [ASK], "tools": [WEATHER]},
    "tool-results": WITH_TOOLS,
    "no-thinking": {"messages": [ASK], "chat_template_kwargs": {"enable_thinking": False}},
    # an assistant's reasoning sent back (reasoning_content): a past turn's (Qwen3 drops it), and one
    # after the last user message, in a tool loop (Qwen3 renders it)
    "thinking": {"messages": [SYSTEM, ASK, {"role": "assistant", "content": "Sonnig — 21 °C.", "reasoning_content": THOUGHT},
                              {"role": "user", "content": "Und morgen? <tag>"}]},
    "thinking-tool-loop": {"messages": [SYSTEM, ASK, {**CALL, "reasoning_content": THOUGHT}, RESULT], "tools": [WEATHER]},
}
UPSTREAM_CHECKED = ["Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                    "Qwen-Qwen3-0.6B.jinja"]


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def start_llama_server(model: Path, template: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([str(build_program("llama-server")), "-m", str(model), "--port", str(port),
                                "-c", str(N_CTX), "-t", "2", "-np", "1", "--no-webui", "--no-warmup", "--jinja",
                                "--chat-template-file", str(template)], stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=5)
            return process, url
        except (urllib.error.URLError, ConnectionError):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"llama-server did not start:\n{log.read_text()}")
            time.sleep(0.2)


@pytest.fixture(params=UPSTREAM_CHECKED)
def both(request, smollm2_path, tmp_path) -> Iterator[tuple[Server, str]]:
    template = templates_dir() / request.param
    ours = start_server(smollm2_path, tmp_path, "--chat-template-file", str(template))
    upstream, url = start_llama_server(smollm2_path, template, tmp_path / "llama-server.log")
    try:
        yield ours, url
    finally:
        upstream.terminate()
        upstream.wait(timeout=60)
        stop_server(ours)


def test_apply_template_is_llama_servers_byte_for_byte(both):
    ours, upstream = both
    for name, body in [("tool-results", WITH_TOOLS), *CONVERSATIONS.items()]:
        status, theirs = _post(upstream + "/apply-template", body)
        assert status == 200, (name, theirs)
        status, mine = ours.request("POST", "/apply-template", body)
        assert status == 200, (name, mine)
        assert mine["prompt"] == theirs["prompt"], name
    assert "Zürich" in theirs["prompt"] or "Z\\u00fcrich" in theirs["prompt"]


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> Model:
    return Model(smollm2_path)


def _templates() -> list[str]:
    return sorted(p.name for p in templates_dir().glob("*.jinja"))


@pytest.mark.parametrize("name", _templates())
def test_every_template_renders_as_llama_cpp_does(smollm2, name):
    """Our chat routes' prompt (the request through our message model) = llama.cpp's rendering of
    the request itself, or both refuse: ChatTemplateError there, a 400 naming the template here.
    A template that does not take tools natively answers in the generic format (its prompt is then
    ours by design: the tools in a system message)."""
    try:
        template = ChatTemplate.from_file(templates_dir() / name, model=smollm2)
    except ChatTemplateError as exc:
        assert name in str(exc)
        return
    for kind, body in CONVERSATIONS.items():
        request = ChatCompletionRequest.model_validate({"model": "m", **body})
        tools, choice = _tools(request)
        if tools and not template.native_tools:  # the generic format: a conversation of its own, by design
            assert render_prompt(template, _turns(request.messages), tools, choice, request.params(None, N_CTX),
                                 template_kwargs=request.chat_template_kwargs).tool_format == "generic", kind
            continue
        try:
            expected = template.apply({"add_generation_prompt": True, **body}).prompt
        except ChatTemplateError as exc:
            assert name in str(exc), (kind, str(exc))
            with pytest.raises(BadRequest, match=name.replace(".", r"\.")):
                render_prompt(template, _turns(request.messages), tools, choice, request.params(None, N_CTX),
                              template_kwargs=request.chat_template_kwargs)
            continue
        ours = render_prompt(template, _turns(request.messages), tools, choice, request.params(None, N_CTX),
                             template_kwargs=request.chat_template_kwargs)
        assert ours.text == expected, kind
        assert ours.tool_format != "generic"
