"""benchmarks/kv_types.py, run as a program on the tiny model: its table has the columns of what ran
(no needle columns with --lengths '', no trace columns with --trace-turns 0), never an empty column
or a NaN cell; asked to measure nothing, or given a length that is no number, it stops with a usage
error. (What it measures on a real model: docs/benchmarks.md.)"""
from __future__ import annotations

import subprocess
import sys
from itertools import takewhile
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "kv_types.py"


def run(model: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCHMARK), "--model", str(model), "--types", "f16", "--no-llama-server",
                           "--session-tokens", "64", *args], capture_output=True, text=True, timeout=600)


def table(stdout: str) -> list[list[str]]:
    """The cells of pyllamaopt's table, header first (the separator line left out)."""
    lines = stdout.split("pyllamaopt (KL, top-1 and greedy agreement against its f16)\n\n", 1)[1].splitlines()
    rows = takewhile(lambda line: line.startswith("|"), lines)
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows if not row.startswith("|---")]


@pytest.mark.parametrize("args, columns, absent", [
    (["--lengths", "", "--trace-turns", "4", "--gen", "2", "--ppl-tokens", "2"],
     ["kv_type", "bytes/token", "sessions", "× f16", "trace KL", "trace top-1", "greedy agreement", "trace ppl"],
     "needle"),
    (["--lengths", "512", "--depths", "50", "--variants", "passkey", "--trace-turns", "0", "--answer-tokens", "2"],
     ["kv_type", "bytes/token", "sessions", "× f16", "needle recall", "needle KL", "needle top-1",
      "prefill 512 × f16", "decode × f16"],
     "trace"),
], ids=["no-needles", "no-trace"])
def test_the_table_has_the_columns_of_what_ran(tiny_model_path, args, columns, absent):
    result = run(tiny_model_path, *args)
    assert result.returncode == 0, result.stderr
    header, *rows = table(result.stdout)
    assert header == columns, result.stdout
    assert [row[0] for row in rows] == ["f16"] and all(len(row) == len(header) and all(row) for row in rows)
    assert "nan" not in result.stdout.lower(), result.stdout
    summary = next(line for line in result.stdout.splitlines() if line.startswith("KV budget"))
    assert ("needles: none" in summary) == (absent == "needle"), summary
    assert ("agent trace: 0 measured turns" in summary) == (absent == "trace"), summary


@pytest.mark.parametrize("args, says", [
    (["--lengths", "", "--trace-turns", "0"], "nothing to measure: give needles (--lengths, --depths, --variants) "
                                              "or --trace-turns 4 or more"),
    (["--lengths", "", "--trace-turns", "3"], "nothing to measure"),
    (["--lengths", "1024,x"], "argument --lengths: '1024,x' is not a comma-separated list of integers"),
])
def test_nothing_to_measure_or_a_bad_length_is_a_usage_error(tiny_model_path, args, says):
    result = run(tiny_model_path, *args)
    assert result.returncode == 2 and says in result.stderr and "usage:" in result.stderr, result.stderr
    assert not result.stdout
