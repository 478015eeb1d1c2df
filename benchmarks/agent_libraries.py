"""Agent libraries with one tool on Qwen2.5-Coder 0.5B, as a user of this model runs them, against
pyllamaopt serve and llama-server built from the same pinned tree (--jinja): docs/clients.md.

    python benchmarks/agent_libraries.py [--model qwen2.5-coder-0.5b] [--engines pyllamaopt,llama-server]

This model writes its calls as bare JSON, without the `<tool_call>` tags of its template, so with
tool_choice auto it never calls (on either server); a user of it makes each library require a tool:
- `openai-agents`: ModelSettings(tool_choice="required") and tool_use_behavior "stop_on_first_tool" (the
  tool's result is the final output): with its default, "run_llm_again", the choice is reset to auto
  once the tool has run (reset_tool_choice), and this model's next reply is its bare JSON call again,
  as text, which the agent returns as its final output;
- `pydantic-ai`: a structured output (output_type), which the library asks for as a call of its
  output tool, with tool_choice "required" on every request; the weather tool is offered until it
  has run (its `prepare`): offered on every turn, the run went on for 35 requests on our server, the
  model calling a tool but not the output tool; at most 4 requests.
Greedy (temperature 0). Prints, per server and library: the tool's calls, the final output or the
library's error. tests/integration/test_serve_agents_qwen.py runs the same functions on our server.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from openai import AsyncOpenAI
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

QUESTION = "What is the weather in Paris?"
INSTRUCTIONS = "You are a helpful assistant. Use the tools to answer."
REPORT = "Sunny, 24 degrees Celsius, light wind."
MAX_TOKENS = 120


@dataclass
class AgentRun:
    calls: list[str] = field(default_factory=list)  # the cities the tool was called with
    output: object = None  # the agent's final output
    error: str | None = None  # the library's exception, if the run failed


class Forecast(BaseModel):
    """pydantic-ai's structured output."""

    city: str
    summary: str


def client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def run_openai_agent(base_url: str) -> AgentRun:
    """An openai-agents Agent through chat completions, a tool required, its result the final output."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.exceptions import AgentsException

    run = AgentRun()

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        run.calls.append(city)
        return REPORT

    set_tracing_disabled(True)  # (its traces go to OpenAI's platform)
    agent = Agent(name="assistant", instructions=INSTRUCTIONS, tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                  model=OpenAIChatCompletionsModel("m", client(base_url)),
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=MAX_TOKENS))
    try:
        run.output = Runner.run_sync(agent, QUESTION, max_turns=4).final_output
    except AgentsException as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def run_pydantic_agent(base_url: str) -> AgentRun:
    """A pydantic-ai Agent whose output is a Forecast (its output tool, a tool required)."""
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.exceptions import AgentRunError
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.usage import UsageLimits
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    run = AgentRun()
    agent = Agent(OpenAIChatModel("m", provider=OpenAIProvider(openai_client=client(base_url))),
                  output_type=Forecast, instructions=INSTRUCTIONS,
                  model_settings={"temperature": 0, "max_tokens": MAX_TOKENS})

    async def until_used(ctx: RunContext, tool: ToolDefinition) -> ToolDefinition | None:
        return None if run.calls else tool

    @agent.tool_plain(prepare=until_used)
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        run.calls.append(city)
        return REPORT

    try:
        run.output = agent.run_sync(QUESTION, usage_limits=UsageLimits(request_limit=4)).output
    except AgentRunError as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    return run


LIBRARIES = {"openai-agents": run_openai_agent, "pydantic-ai": run_pydantic_agent}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--engines", default="pyllamaopt,llama-server")
    args = parser.parse_args()
    from server import running  # (benchmarks/server.py: either server as a process)

    from pyllamaopt import Model, models

    model = Model(models.resolve(args.model))
    engines = args.engines.split(",")
    server_bin = None
    if "llama-server" in engines:
        import build_upstream

        server_bin = build_upstream.build(("llama-server",)) / "llama-server"
    print(f"model {model.description}; greedy; {QUESTION!r}")
    for engine in engines:
        with running(engine, model, server_bin, 2048, jinja=True) as server:
            for library, run_agent in LIBRARIES.items():
                run = run_agent(f"http://127.0.0.1:{server.port}/v1")
                outcome = f"error {run.error}" if run.error else f"output {run.output!r}"
                print(f"{engine:>13} {library:>13}: tool calls {run.calls}; {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
