"""A scripted coding-agent conversation, rendered the way agent clients re-send it every turn.

Deterministic text (no randomness at run time): a system prompt with tool definitions, then
turns of user requests, assistant answers (with a reasoning block and a tool call) and tool
results (file dumps, test output). Renderings (the first three are the shapes of
benchmarks/agent_trace.py):

  append    every turn re-sends the conversation so far, unchanged, plus the new messages
  reasoning earlier assistant turns lose their reasoning block (as Qwen3's template does), so
            the previous answer changes in the re-sent text
  workspace a workspace file is shown right after the system prompt (as Aider does) and is
            edited every few turns, so everything after it changes
  edits     three workspace files after the system prompt, several of their functions rewritten
            every few turns (a docstring grows, a guard line is added): lines change length, so
            everything after each edit shifts by a few tokens
  header    the system prompt's first line is a per-request header (as Claude Code's billing
            header, whose hash changes every request: llama.cpp issue #19494), so every request
            differs from the previous one a few tokens after its start
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

TOOLS = [
    ("read_file", "Read a file of the repository.", {"path": "string"}),
    ("write_file", "Replace the content of a file.", {"path": "string", "content": "string"}),
    ("edit_file", "Replace one exact snippet of a file by another.", {"path": "string", "old": "string", "new": "string"}),
    ("run_tests", "Run the test suite, or the tests matching a pattern.", {"pattern": "string"}),
    ("search", "Search the repository for a regular expression.", {"regex": "string", "glob": "string"}),
    ("list_dir", "List a directory.", {"path": "string"}),
    ("git_diff", "Show the uncommitted changes.", {}),
    ("ask_user", "Ask the user a question when the task is ambiguous.", {"question": "string"}),
]

RULES = [
    "Work in small, verifiable steps and run the tests after every change.",
    "Never change a test to make it pass unless the user asks you to.",
    "Keep the public API stable; add deprecation warnings instead of removing functions.",
    "Prefer the standard library; add a dependency only when it saves real work.",
    "Write type hints and docstrings for every public function.",
    "Explain each change in one sentence when you are done.",
    "When a tool fails, read its error message before trying again.",
    "Do not print secrets, tokens or passwords found in the repository.",
]


def system_prompt() -> str:
    tools = "\n".join(json.dumps({"name": n, "description": d, "parameters": {"type": "object", "properties": {
        k: {"type": v, "description": f"the {k} argument of {n}"} for k, v in p.items()}, "required": list(p)}})
        for n, d, p in TOOLS)
    rules = "\n".join(f"{i + 1}. {r}" for i, r in enumerate(RULES * 6))
    return ("You are an autonomous coding agent working in a Python repository on the user's machine.\n"
            "You can call these tools by answering with a JSON object {\"tool\": name, \"arguments\": {...}}.\n\n"
            f"# Tools\n{tools}\n\n# Rules\n{rules}\n\n"
            "# Repository\nA small library `mathkit` with modules mathkit/core.py, mathkit/stats.py, "
            "mathkit/io.py and tests in tests/. Python 3.11, pytest.\n")


def python_file(name: str, n_functions: int, bug_in: int | None = None) -> str:
    out = [f'"""mathkit.{name}: helpers of the {name} module."""', "from __future__ import annotations", ""]
    for i in range(n_functions):
        op = "-" if i == bug_in else "+"
        out += [f"def {name}_op_{i}(a: float, b: float) -> float:",
                f'    """Combine a and b (variant {i}); see docs/{name}.md#{i}."""',
                f"    if a < 0 or b < 0:",
                f'        raise ValueError("{name}_op_{i} needs non-negative numbers")',
                f"    return a {op} b * {i + 1}", ""]
    return "\n".join(out)


def test_output(n_passed: int, failures: list[str]) -> str:
    lines = [f"tests/test_{f}.py::test_{f} FAILED" for f in failures]
    lines += [f"tests/test_case_{i}.py::test_case_{i} PASSED" for i in range(n_passed)]
    summary = f"{len(failures)} failed, {n_passed} passed" if failures else f"{n_passed} passed"
    return "\n".join(lines + [f"==== {summary} in 0.{n_passed + 13}s ===="])


@dataclass(frozen=True)
class Turn:
    user: str          # what arrives this turn (a user message or a tool result)
    reasoning: str     # the assistant's reasoning block
    answer: str        # the assistant's visible answer (a tool call or a summary)


def turns(n: int = 22) -> list[Turn]:
    """n turns of a bug-fixing session; tool results grow the conversation to 6-8k tokens."""
    modules = ["core", "stats", "io"]
    out = [Turn("User: The function core_op_3 returns wrong results and test_core_op_3 fails. Please fix it.",
                "The user reports a failing test; I should run it first to see the error.",
                '{"tool": "run_tests", "arguments": {"pattern": "test_core_op_3"}}')]
    for t in range(1, n):
        kind = t % 4
        module = modules[t % 3]
        if kind == 1:
            user = "Tool result (run_tests):\n" + test_output(8 + t, [f"{module}_op_{t % 5}"])
            reasoning = f"The test of {module}_op_{t % 5} fails; I need to read mathkit/{module}.py."
            answer = json.dumps({"tool": "read_file", "arguments": {"path": f"mathkit/{module}.py"}})
        elif kind == 2:
            user = f"Tool result (read_file mathkit/{module}.py):\n" + python_file(module, 5, bug_in=t % 5)
            reasoning = f"{module}_op_{t % 5} subtracts instead of adding; a one-character edit fixes it."
            answer = json.dumps({"tool": "edit_file", "arguments": {
                "path": f"mathkit/{module}.py", "old": f"return a - b * {t % 5 + 1}", "new": f"return a + b * {t % 5 + 1}"}})
        elif kind == 3:
            user = "Tool result (edit_file): ok"
            reasoning = "The edit applied; now the whole suite must pass."
            answer = json.dumps({"tool": "run_tests", "arguments": {"pattern": ""}})
        else:
            user = f"User: Thanks. Now also check the {module} module for the same mistake."
            reasoning = f"Same pattern might exist in {module}; search for subtractions."
            answer = json.dumps({"tool": "search", "arguments": {"regex": "return a - b", "glob": "mathkit/*.py"}})
        out.append(Turn(user, reasoning, answer))
    return out


def workspace_file(version: int) -> str:
    """The file an Aider-style client shows after the system prompt; edited every few turns."""
    return python_file("core", 6, bug_in=None if version else 3) + f"\n# revision {version}\n"


def edited_workspace(version: int, n_functions: int = 14) -> str:
    """The files of the "edits" shape at a version: every version rewrites two functions of each
    file (its docstring gains a sentence, a guard line is added), at places spread over the files."""
    files = []
    for f, module in enumerate(("core", "stats", "io")):
        lines = [f'"""mathkit.{module}: helpers of the {module} module."""', "from __future__ import annotations", ""]
        for i in range(n_functions):
            edits = sum((3 * v + f) % n_functions == i or (7 * v + 2 * f) % n_functions == i for v in range(1, version + 1))
            lines += [f"def {module}_op_{i}(a: float, b: float) -> float:",
                      f'    """Combine a and b (variant {i}); see docs/{module}.md#{i}.'
                      + "".join(f" Reviewed in round {k + 1}." for k in range(edits)) + '"""',
                      *(f"    assert a == a and b == b, \"round {k + 1}: no NaN\"" for k in range(edits)),
                      "    if a < 0 or b < 0:",
                      f'        raise ValueError("{module}_op_{i} needs non-negative numbers")',
                      f"    return a + b * {i + 1}", ""]
        files.append(f"mathkit/{module}.py\n```\n" + "\n".join(lines) + "```")
    return "\n".join(files)


def request_header(i: int) -> str:
    """The first line of the system prompt of request i in the "header" shape."""
    cch = hashlib.sha256(f"request {i}".encode()).hexdigest()[:5]
    return f"x-anthropic-billing-header: cc_version=2.1.42.{834 + i}; cc_entrypoint=cli; cch={cch};\n"


def render(system: str, history: list[Turn], current: Turn, *, shape: str, workspace_version: int = 0) -> str:
    """The prompt sent at a turn: everything so far, ending where the assistant answers."""
    header = request_header(len(history)) if shape == "header" else ""
    parts = [f"<start_of_turn>system\n{header}{system}<end_of_turn>\n"]
    if shape == "workspace":
        parts.append(f"<start_of_turn>user\nFiles in the chat:\nmathkit/core.py\n```\n{workspace_file(workspace_version)}```"
                     f"<end_of_turn>\n")
    if shape == "edits":
        parts.append(f"<start_of_turn>user\nFiles in the chat:\n{edited_workspace(workspace_version)}<end_of_turn>\n")
    for i, turn in enumerate(history):
        # the last assistant turn keeps its reasoning; earlier ones lose it in the "reasoning" shape
        keep_reasoning = shape != "reasoning" or i == len(history) - 1
        think = f"<think>{turn.reasoning}</think>\n" if keep_reasoning else ""
        parts.append(f"<start_of_turn>user\n{turn.user}<end_of_turn>\n<start_of_turn>model\n{think}{turn.answer}<end_of_turn>\n")
    parts.append(f"<start_of_turn>user\n{current.user}<end_of_turn>\n<start_of_turn>model\n")
    return "".join(parts)


def session_task(i: int, n: int = 4) -> list[Turn]:
    """Agent i's own short task, for the shapes where agents share the system prompt: n turns
    (read, edit, test, done; past 4, the bug-fixing session of `turns` goes on)."""
    module = ["core", "stats", "io"][i % 3]
    task = [Turn(f"User: Task {i}: add a docstring example to {module}_op_{i}.", "Read the file first.",
                 json.dumps({"tool": "read_file", "arguments": {"path": f"mathkit/{module}.py"}})),
            Turn(f"Tool result (read_file mathkit/{module}.py):\n" + python_file(module, 2 + i % 3), "Edit it.",
                 json.dumps({"tool": "edit_file", "arguments": {"path": f"mathkit/{module}.py", "old": "x", "new": "y"}})),
            Turn("Tool result (edit_file): ok", "Run the tests.", json.dumps({"tool": "run_tests", "arguments": {
                "pattern": f"test_{module}"}})),
            Turn("Tool result (run_tests):\n" + test_output(4 + i, []), "Done.", "Added the example.")]
    return (task + turns(max(n - 3, 1))[1:])[:n]
