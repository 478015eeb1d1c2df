"""The pyllamaopt command line, run as a user would."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

# the installed console script, run outside the checkout (whose pyllamaopt/ has no _core)
CLI = Path(sys.executable).parent / "pyllamaopt"


def run(*args, env=None, input=None):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_OPT_")}
    environment.update(env or {})
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=environment, input=input,
                              cwd=cwd, timeout=300)


def test_help_names_every_command():
    result = run("--help")
    assert result.returncode == 0
    for command in ("run", "chat", "demo", "config", "info"):
        assert command in result.stdout
    assert "LLAMA_OPT_" in result.stdout


def test_config_shows_values_and_sources():
    result = run("config", env={"LLAMA_OPT_BLOCK_SIZE": "32"})
    assert result.returncode == 0
    line = next(l for l in result.stdout.splitlines() if l.startswith("block_size"))
    assert line.split()[:3] == ["block_size", "32", "environment"]
    assert "h2o" in result.stdout and "compiled" in result.stdout


def test_config_list_names_every_variable():
    result = run("config", "--list")
    assert result.returncode == 0
    assert "LLAMA_OPT_DIFF_MIN_UNCHANGED" in result.stdout and "LLAMA_OPT_MODEL" in result.stdout


def test_malformed_variable_is_a_clear_error():
    result = run("config", env={"LLAMA_OPT_BLOCK_SIZE": "abc"})
    assert result.returncode == 2
    assert "LLAMA_OPT_BLOCK_SIZE=abc" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_on_a_model_file(tiny_model_path):
    result = run("run", "--model", str(tiny_model_path), "-n", "8", "-t", "2", "the capital of france is")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_run_reads_stdin_and_model_from_the_environment(tiny_model_path):
    result = run("run", "-n", "4", env={"LLAMA_OPT_MODEL": str(tiny_model_path)}, input="hello world")
    assert result.returncode == 0, result.stderr


def test_chat_needs_a_template(tiny_model_path):
    result = run("chat", "--model", str(tiny_model_path), input="hi\n")
    assert result.returncode == 2
    assert "no chat template" in result.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    result = run("run", "--model", str(tmp_path / "nope.gguf"), "hi")
    assert result.returncode == 2
    assert "No such file" in result.stderr and "Traceback" not in result.stderr


def test_info(tiny_model_path):
    result = run("info", "--model", str(tiny_model_path))
    assert result.returncode == 0
    assert "llama_cpp_commit" in result.stdout and "layers 2" in result.stdout
