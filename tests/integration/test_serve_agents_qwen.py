"""Agent libraries on Qwen2.5-Coder 0.5B through the server, as a user of this model runs them
(benchmarks/agent_libraries.py: the same runs against llama-server; docs/clients.md), greedy.

The model writes its calls as bare JSON without its template's `<tool_call>` tags, so each library is
made to require a tool: `openai-agents` with ModelSettings(tool_choice="required") and the tool's
result as the final output (tool_use_behavior "stop_on_first_tool"), `pydantic-ai` with a structured
output (its output tool, tool_choice "required" on every request; the weather tool offered until it has
run). Both need the server to honour "required": the
reply opens with a call in the model's syntax (native_prompt.narrowed_grammar); with the pinned
tree's grammar the reply is the bare JSON as text (llama-server's), and neither agent gets its call."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_serve import Server, start_server, stop_server

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from agent_libraries import REPORT, Forecast, run_openai_agent, run_pydantic_agent  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(qwen_path, tmp_path_factory) -> Iterator[Server]:
    s = start_server(qwen_path, tmp_path_factory.mktemp("qwen-agents"), "--n-ctx", "2048")
    yield s
    stop_server(s)


def test_an_openai_agents_agent_calls_its_tool(served):
    run = run_openai_agent(served.url + "/v1")
    assert run.error is None, run.error
    assert len(run.calls) == 1 and "paris" in run.calls[0].lower(), run.calls
    assert run.output == REPORT


def test_a_pydantic_ai_agent_calls_its_tool_and_gives_its_structured_output(served):
    run = run_pydantic_agent(served.url + "/v1")
    assert run.error is None, run.error
    assert len(run.calls) == 1 and "paris" in run.calls[0].lower(), run.calls
    assert isinstance(run.output, Forecast) and "paris" in run.output.city.lower() and run.output.summary.strip(), run.output
