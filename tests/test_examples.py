"""The SDK examples (examples/python, sdks/typescript/examples) run as a user runs them, against a
real server process: here on the tiny model (the examples' "plain" chat format), on SmolLM2 in
tests/integration/test_examples_smollm2.py. For the same conversation the Python and TypeScript
examples print the same replies (one protocol, greedy decoding)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_serve import Server, free_port, start_server, stop_server

ROOT = Path(__file__).resolve().parent.parent
PYTHON_EXAMPLES = ROOT / "examples" / "python"
TYPESCRIPT_EXAMPLES = ROOT / "sdks" / "typescript" / "examples"
TURN = re.compile(r"^\[turn (\d+): (\d+) tokens appended, (\d+) generated \((\w+)\); history (\d+) tokens, "
                  r"(\d+) computed this turn\]$", re.MULTILINE)


def run_python(example: str, address: str, *args: str, stdin: str | None = None) -> str:
    # the examples import their sibling chatformat.py: from the script's directory, which is not on
    # sys.path where PYTHONSAFEPATH is set (tools/sanitize.sh sets it)
    path = os.pathsep.join(filter(None, [str(PYTHON_EXAMPLES), os.environ.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(PYTHON_EXAMPLES / f"{example}.py"), "--address", address, *args],
                         input=stdin, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": path})
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def run_node(example: str, url: str, *args: str, stdin: str | None = None) -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the TypeScript examples need Node 20+")
    run = subprocess.run([node, str(TYPESCRIPT_EXAMPLES / f"{example}.js"), "--url", url, *args],
                         input=stdin, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def without_ids(output: str) -> str:
    """What does not depend on the server's state: no session ids, no count of tokens computed (a later
    run finds the blocks an earlier one computed in the server's block pool)."""
    return re.sub(r"\d+ computed this turn", "computed", re.sub(r"\[session \S+:", "[session:", output))


BLOCK = 64


def check_chat(output: str, fmt: str, turns: int) -> list[tuple[int, ...]]:
    """The turn lines of a chat's output: one session, grown by appends only (each turn's history is
    the previous one, the tokens appended and the tokens generated); a turn computes its new tokens,
    the previous reply's again (exact mode: generated tokens are recomputed on the canonical schedule)
    and at most a block more (the last partial one, or a history shorter than a block), never the
    earlier turns."""
    assert output.startswith(f"[chat format: {fmt}]\n"), output
    rows = [tuple(int(x) if x.isdigit() else x for x in m) for m in TURN.findall(output)]
    assert [r[0] for r in rows] == list(range(1, turns + 1)), output
    for before, row in zip(rows, rows[1:]):
        _, appended, generated, _, history, computed = row
        assert history == before[4] + appended + generated, output
        assert computed < appended + before[2] + BLOCK, f"turn {row[0]} computed the earlier turns again: {output}"
    assert output.rstrip().endswith(f": {rows[-1][4]} tokens]"), output
    return rows


@pytest.fixture(scope="module")
def served(tiny_model_path, tmp_path_factory) -> Iterator[tuple[Server, str]]:
    grpc_port = free_port()  # one thread: the examples' timings are not the machine's load
    server = start_server(tiny_model_path, tmp_path_factory.mktemp("examples"), "--grpc-port", str(grpc_port),
                          "--n-ctx", "4096", "--threads", "1")
    yield server, f"127.0.0.1:{grpc_port}"
    stop_server(server)


MESSAGES = ["hello world", "what is the capital of france"]


def test_chat(served):
    server, address = served
    python = run_python("chat", address, *MESSAGES)
    check_chat(python, "plain", 2)
    assert without_ids(run_node("chat", server.url, *MESSAGES)) == without_ids(python)
    assert without_ids(run_node("chat", address, *MESSAGES)) == without_ids(python)  # over gRPC


def test_chat_reads_the_terminal(served):
    server, address = served
    typed = "".join(f"{m}\n" for m in MESSAGES) + "\n"  # an empty line ends
    python = run_python("chat", address, stdin=typed)
    check_chat(python.replace("> ", ""), "plain", 2)
    node = run_node("chat", server.url, stdin=typed)
    assert without_ids(node.replace("> ", "")) == without_ids(python.replace("> ", ""))


def test_tool_loop(served):
    """--tool-choice required: the tiny model's first reply is a call (the schema admits nothing else),
    the example runs the tool and appends its result; every reply parses (the grammar forces JSON)."""
    server, address = served
    args = ("What is the weather in Paris?", "--tool-choice", "required")
    python = run_python("tools", address, *args)
    lines = python.splitlines()
    assert re.fullmatch(r"\[session \S+: \d+ tokens, [2-4] rounds\]", lines[-1]), python
    call = r'round \d: (get_weather\(\{"city":".*"\}\)|add\(\{"a":.*,"b":.*\}\)) -> .*'
    assert re.fullmatch(call, lines[0]), python
    for line in lines[1:-1]:  # calls of the tools, then an answer
        assert re.fullmatch(f"{call}|answer: .*|round \\d: the reply did not end within 256 tokens: .*", line), python
    assert without_ids(run_node("tools", server.url, *args)) == without_ids(python)
    assert without_ids(run_node("tools", address, *args)) == without_ids(python)  # over gRPC


def report(output: str) -> dict[str, str]:
    """The cancel example's report lines ("sync: ...", "async: ..."), by their label; and "text", the
    generated text before them."""
    text, _, lines = output.partition("\nsync: " if "\nsync: " in output else "\nbreak: ")
    lines = ("sync: " if "\nsync: " in output else "break: ") + lines
    found: dict[str, str] = {"text": text}
    for line in lines.splitlines():
        label, _, rest = line.partition(": ")
        found[label] = found[label] + "\n" + rest if label in found else rest
    return found


def check_cancel(python: str, node: str, seconds: str) -> None:
    """The generation stopped where the loop was left, the history kept what was generated until the
    server stopped, the deadline cancelled the second one, the session went on; TypeScript's the same."""
    sync, kept, *_ = report(python)["sync"].splitlines()
    assert sync == "interrupted after 20 tokens", python
    kept_tokens = re.fullmatch(r"appended the next turn; the history kept the (\d+) tokens generated before the "
                               r"stop \(the server may have made one more than this client read\)", kept)
    assert kept_tokens and 20 <= int(kept_tokens[1]) < 1000, python
    cancelled, appended = report(python)["async"].splitlines()
    assert re.fullmatch(rf"cancelled at the {seconds} s deadline, \d+ tokens received", cancelled), python
    assert re.fullmatch(r"appended the next turn; the session has \d+ tokens", appended), python
    assert "after" in report(python)

    lines = report(node)
    assert lines["text"] == report(python)["text"] and lines["break"].startswith("interrupted after 20 tokens\n"), node
    ms = round(float(seconds) * 1000)
    assert re.fullmatch(rf"cancelled at the {ms} ms deadline, \d+ tokens received", lines["signal"].splitlines()[0]), node


def test_cancel(served):
    """A 5 ms deadline: the tiny model generates a token in about 0.4 ms, and its greedy text (whose
    start depends on where the first cancel stopped) can end by itself within 50 ms (it did in CI)."""
    server, address = served
    python = run_python("cancel", address, "--after-seconds", "0.005")
    check_cancel(python, run_node("cancel", server.url, "--after-ms", "5"), "0.005")
    check_cancel(python, run_node("cancel", address, "--after-ms", "5"), "0.005")  # over gRPC


def doc_snippet(doc: str, after: str, language: str) -> str:
    """The first code block of `language` after the line `after` in docs/`doc`."""
    text = (ROOT / "docs" / doc).read_text()
    found = re.search(re.escape(after) + rf".*?```{language}\n(.*?)```", text, re.S)
    assert found, f"no {language} block after {after!r} in docs/{doc}"
    return found[1]


def test_the_client_docs_python_snippet_runs_as_written(served, tmp_path):
    """docs/client.md's Python snippet ran into names it never defined (a newcomer's walkthrough): it
    runs as written, the address aside."""
    _, address = served
    python = doc_snippet("client.md", "## Python: `pyllamaopt.client` (gRPC)", "python").replace(
        "127.0.0.1:50051", address)
    run = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip(), run.stdout + run.stderr


def test_the_typescript_readme_snippet_runs_as_written(served, tmp_path):
    """The TypeScript README's snippet, likewise (its package name pointed at the SDK's source)."""
    _, address = served
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the TypeScript SDK needs Node 20+")  # (as run_node; CI has Node 20)
    readme = (ROOT / "sdks" / "typescript" / "README.md").read_text()
    js = re.search(r"```js\n(.*?)```", readme, re.S)[1].replace("127.0.0.1:50051", address).replace(
        '"pyllamaopt-client"', f'"{ROOT / "sdks" / "typescript" / "src" / "index.js"}"')
    (tmp_path / "readme.mjs").write_text(js)
    run = subprocess.run([node, str(tmp_path / "readme.mjs")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip(), run.stdout + run.stderr
