"""The SDK examples on a model with a chat format (SmolLM2 135M Instruct, ChatML): the chat keeps one
session and answers both questions, the tool loop calls the weather tool with the city and then
answers, cancellation stops a long answer; Python and TypeScript print the same conversation."""
from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from test_examples import check_cancel, check_chat, run_node, run_python, without_ids
from test_serve import Server, free_port, start_server, stop_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory) -> Iterator[tuple[Server, str]]:
    grpc_port = free_port()
    server = start_server(smollm2_path, tmp_path_factory.mktemp("examples"), "--grpc-port", str(grpc_port),
                          "--n-ctx", "4096", "--threads", "1")
    yield server, f"127.0.0.1:{grpc_port}"
    stop_server(server)


def test_chat(served):
    server, address = served
    questions = ["What is the capital of France?", "And of Italy?"]
    python = run_python("chat", address, *questions)
    rows = check_chat(python, "chatml", 2)
    assert [row[3] for row in rows] == ["eos", "eos"], python  # each reply ended by the model's <|im_end|>
    first, second = re.split(r"\n\[turn 1:.*\n", python)
    assert "Paris" in first and "Rome" in second, python
    assert without_ids(run_node("chat", server.url, *questions)) == without_ids(python)


def test_tool_loop(served):
    server, address = served
    python = run_python("tools", address, "What is the weather in Paris?")
    lines = python.splitlines()
    assert lines[0] == 'round 1: get_weather({"city":"Paris"}) -> {"city":"Paris","sky":"sunny","celsius":21}', python
    assert any(line.startswith("answer: ") for line in lines[1:-1]), python
    assert without_ids(run_node("tools", server.url, "What is the weather in Paris?")) == without_ids(python)


def test_cancel(served):
    """A 5 ms deadline, as on Gemma: SmolLM2's greedy answer to "Go on." ends by itself after 53 tokens,
    which a quiet machine generates within the example's default 1 s deadline (it did in CI)."""
    server, address = served
    check_cancel(run_python("cancel", address, "--after-seconds", "0.005"),
                 run_node("cancel", server.url, "--after-ms", "5"), "0.005")
