"""Batch invariance of ggml's CPU kernels (tools/upstream/test-row-invariance.cpp, in the style of
llama.cpp's test-backend-ops): with patches/0006's row-invariant batch on, every row of a
matrix product (the default model's weight types Q8_0, Q5_0, Q4_K, Q6_K, and F32, F16, Q4_0, and SmolLM2's
Q4_1; batches of 2..64, 128 and 512 rows) and of flash attention (query rows against the one-row
decode path, KV lengths across 64-cell tiles, Gemma 3's and SmolLM2's head layouts) is bitwise
equal to the same row computed alone. With upstream's kernel choice the same program finds the
rows that differ: the test can fail. The check runs on this machine's build and on builds for
x86 with AVX2 only and for no SIMD at all."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from upstream_programs import OTHER_CPUS, build_for_other_cpu, build_program

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def program() -> Path:
    return build_program("test-row-invariance")


def run(program: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(program), *args], capture_output=True, text=True, timeout=1200)


def differing(output: str) -> dict[str, set[int]]:
    """{case name: batch sizes with differing rows}, from the program's DIFF lines."""
    found: dict[str, set[int]] = {}
    for case, rows in re.findall(r"^DIFF (.+?) threads=\d+ rows=(\d+)", output, re.M):
        found.setdefault(case, set()).add(int(rows))
    return found


@pytest.mark.parametrize("kernels", [[], ["--one-row-kernels"]], ids=["multi-row", "one-row"])
def test_every_row_equals_the_row_alone(program, kernels):
    """patches/0009's multi-row kernels (default) and 0006's one-row kernels row by row."""
    result = run(program, *kernels)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "PASS: 0 of 1934" in result.stdout
    for case in (*WEIGHT_CASES, "flash_attn_ext"):
        assert re.search(rf"^ok   {case} ", result.stdout, re.M), case


WEIGHT_CASES = ("mul_mat q8_0", "mul_mat q5_0", "mul_mat q4_K", "mul_mat q6_K", "mul_mat f32", "mul_mat f16",
                "mul_mat q4_0", "mul_mat q4_1")


def assert_a_kernel_table_keeps_every_row(program: Path) -> str:
    result = run(program, "--table")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"^PASS: 0 of \d+ .*table-chosen", result.stdout, re.M), result.stdout[-2000:]
    for case in WEIGHT_CASES:
        assert re.search(rf"^ok   {case} .* table$", result.stdout, re.M), case
    return result.stdout


def test_a_kernel_table_keeps_every_row(program):
    """patches/0019's table (methods/row-kernels picks per weight type and row count): for 1..16 rows
    the multi-row and the row-by-row path each give the rows' bits computed alone row by row, also
    while two callers compute at once with opposite tables; a timed run's time lands in its cell,
    for the types with a multi-row kernel on this x86 build (0009) and only for those."""
    output = assert_a_kernel_table_keeps_every_row(program)
    timed = dict(re.findall(r"^timed mul_mat (\S+) k=\d+ n=\d+ rows 5: (yes|no)$", output, re.M))
    # (Q4_0 is repacked on this CPU, as llama.cpp places it: its 8x8 gemv has no multi-row kernel)
    assert timed == {"q8_0": "yes", "q5_0": "yes", "q4_K": "yes", "q6_K": "yes", "q4_0": "no",
                     "f32": "no", "f16": "no", "q4_1": "yes"}, output[-3000:]


def test_upstream_kernels_change_rows(program):
    """The check fails where upstream switches kernels by batch size: tinyBLAS for F32/F16 from 2
    rows, the repacked Q4_K gemm from 4, the tiled Q6_K kernel from 8, multi-query flash
    attention from 2. (Q8_0 and Q5_0 go through tinyBLAS too, whose per-output order is the
    one-row kernel's, and Q4_1 through vec_dot per output at every size: no row differs.)"""
    result = run(program, "--upstream", "--quick")
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    found = differing(result.stdout)
    assert min(found["mul_mat f32 k=640 n=256"]) == 2
    assert min(found["mul_mat f16 k=640 n=256"]) == 2
    assert min(found["mul_mat q4_K k=1024 n=640"]) == 4
    assert min(found["mul_mat q6_K k=2048 n=640"]) == 8
    assert min(found["flash_attn_ext d=256 heads=4/1 n_kv=300"]) == 2
    assert not any(name.startswith(("mul_mat q8_0", "mul_mat q5_0", "mul_mat q4_1")) for name in found)


@pytest.mark.parametrize("cpu", OTHER_CPUS)
def test_every_row_equals_the_row_alone_on_other_cpus(cpu):
    """The same check in a build for another CPU than this one's (ggml's explicit switches): the
    kernels' AVX2 paths without AVX-512, and the generic C of a build without SIMD. Upstream's
    kernel choice still changes rows there: the check can fail on each build."""
    program = build_for_other_cpu("test-row-invariance", cpu)
    result = run(program)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "PASS: 0 of 1934" in result.stdout
    assert_a_kernel_table_keeps_every_row(program)
    upstream = run(program, "--upstream", "--quick")
    assert upstream.returncode == 1, upstream.stdout[-4000:] + upstream.stderr[-2000:]
    assert differing(upstream.stdout)
