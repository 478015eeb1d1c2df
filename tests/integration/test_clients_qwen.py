"""Agents on Qwen2.5-Coder 0.5B Instruct (its GGUF template calls tools natively, Hermes-style
<tool_call>), driven by the real client libraries against our server and against llama-server
built from the same pinned tree (--jinja): the `openai` client's tool loop (call -> result ->
answer), streamed and not; an `openai-agents` agent and a `pydantic-ai` agent with one tool. Greedy
(temperature 0, a seed): each asserts the call's name and parsed arguments, and that the answer
after the result reports the result. docs/clients.md has the table of what passed where."""
from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from test_serve import free_port, start_server, stop_server
from upstream_programs import build_program

pytestmark = pytest.mark.integration

N_CTX = "4096"  # (a tools block, an agent's instructions and a result)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name"}},
                   "required": ["city"]}}}
SYSTEM = "You are a helpful assistant. Use the tools when they help."
QUESTION = "What is the weather in Paris right now?"
RESULT = "Sunny, 23 degrees Celsius, light wind."
SAMPLING: dict[str, Any] = {"temperature": 0, "seed": 0, "max_tokens": 120}


def start_llama_server(model: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([str(build_program("llama-server")), "-m", str(model), "--port", str(port),
                                "-c", N_CTX, "-t", "2", "-np", "1", "--no-webui", "--jinja"],
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
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


@pytest.fixture(scope="module", params=["pyllamaopt", "llama-server"])
def base_url(request, qwen_path, tmp_path_factory) -> Iterator[str]:
    """The /v1 address of the server under test."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "pyllamaopt":
        ours = start_server(qwen_path, tmp, "--n-ctx", N_CTX)
        yield ours.url + "/v1"
        stop_server(ours)
    else:
        process, url = start_llama_server(qwen_path, tmp / "llama-server.log")
        yield url + "/v1"
        process.terminate()
        process.wait(timeout=60)


def client_of(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def paris(arguments: dict[str, Any]) -> None:
    assert list(arguments) == ["city"] and "Paris" in arguments["city"], arguments


def reports_the_result(answer: str | None) -> None:
    assert answer and "23" in answer, answer


ASK = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


def answer_after(client: openai.OpenAI, call: dict[str, Any], **extra: Any) -> Any:
    """The second request of the loop: the call made and its result."""
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": call["id"], "content": RESULT}]
    return client.chat.completions.create(model="m", messages=history, tools=[WEATHER], **SAMPLING, **extra)


def test_openai_tool_loop(base_url):
    client = client_of(base_url)
    reply = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], **SAMPLING)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id
    paris(json.loads(call.function.arguments))
    answer = answer_after(client, call.model_dump(include={"id", "type", "function"}))
    assert answer.choices[0].finish_reason == "stop" and not answer.choices[0].message.tool_calls
    reports_the_result(answer.choices[0].message.content)


def test_openai_tool_loop_streamed(base_url):
    client = client_of(base_url)
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], stream=True, **SAMPLING):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                call["id"] += delta.id or ""
                if delta.function:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0], calls
    call = calls[0]
    assert call["function"]["name"] == "get_weather" and call["id"]
    paris(json.loads(call["function"]["arguments"]))
    text = "".join(c.choices[0].delta.content or "" for c in
                   answer_after(client, call, stream=True) if c.choices)
    reports_the_result(text)


def test_openai_agents_agent(base_url):
    agents = pytest.importorskip("agents", reason="openai-agents is not installed (pip install openai-agents)")
    agents.set_tracing_disabled(True)  # (no network: nothing is exported)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city's name.
        """
        seen.append(city)
        return RESULT

    model = agents.OpenAIChatCompletionsModel(model="m", openai_client=openai.AsyncOpenAI(
        base_url=base_url, api_key="unused", max_retries=0, timeout=300))
    agent = agents.Agent(name="weather", instructions=SYSTEM, tools=[get_weather], model=model,
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=120, extra_args={"seed": 0}))
    result = asyncio.run(agents.Runner.run(agent, QUESTION, max_turns=4))
    assert len(seen) == 1, seen
    paris({"city": seen[0]})
    reports_the_result(result.final_output)


def test_pydantic_ai_agent(base_url):
    pydantic_ai = pytest.importorskip("pydantic_ai", reason="pydantic-ai is not installed "
                                                            "(pip install 'pydantic-ai-slim[openai]')")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    seen: list[str] = []
    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=base_url, api_key="unused"))
    agent = pydantic_ai.Agent(model, instructions=SYSTEM,
                              model_settings={"temperature": 0, "seed": 0, "max_tokens": 120})

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city's name.
        """
        seen.append(city)
        return RESULT

    result = agent.run_sync(QUESTION)
    assert len(seen) == 1, seen
    paris({"city": seen[0]})
    reports_the_result(result.output)
