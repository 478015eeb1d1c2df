"""patches/0016: Q5_0 weights also held as Q8_0 blocks with the same scale and integers (batches of
more than 16 rows read those, smaller ones Q5_0's own blocks) must give Q5_0's products bit for bit.
The program (tools/upstream/test-q5_0-as-q8_0.cpp) compares both, output by output, over Gemma 3
270M's weight shapes and odd ones, 1-512 rows, 1-3 threads, pyllamaopt's and upstream's kernel
choices, and checks that the switch decides where llama.cpp places a Q5_0 weight. Mutation runs: a
conversion that takes one high bit from the wrong place fails the 120 checks of 17-512 rows, the
Q5_0 blocks read one block off the 180 of 1-16 rows. It runs on this machine's build and on builds
for x86 with AVX2 only and for no SIMD at all, whose Q5_0 and Q8_0 kernels are other code.
pyllamaopt turns the switch on before it loads a model: Gemma's Q5_0 weights are in the widened
buffer."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from upstream_programs import OTHER_CPUS, build_for_other_cpu, build_program

pytestmark = pytest.mark.slow

CHECKS = "PASS: 0 of 300 checks with differing outputs"


def run(program: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(program)], capture_output=True, text=True, timeout=600)


def test_widened_weights_give_q5_0s_bits():
    result = run(build_program("test-q5_0-as-q8_0"))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "switch off: CPU; on: CPU_Q5_0_AS_Q8_0" in result.stdout
    assert CHECKS in result.stdout


@pytest.mark.parametrize("cpu", OTHER_CPUS)
def test_widened_weights_give_q5_0s_bits_on_other_cpus(cpu):
    result = run(build_for_other_cpu("test-q5_0-as-q8_0", cpu))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert CHECKS in result.stdout


PROBE = """
import sys
import numpy as np
from pyllamaopt import Context, Model, _core

widened = Model(sys.argv[1], verbose=True, progress=False)
print("--- switch off", file=sys.stderr, flush=True)
_core._set_q5_0_widened(False)  # for models loaded from now on; the one above keeps its buffer
plain = Model(sys.argv[1], verbose=True, progress=False)
prompt = widened.tokenize("The weights of a matrix product, held twice. " * 30)
logits = []
for model in (widened, plain):
    with Context(model, n_ctx=1024) as ctx:
        s = ctx.session()
        s.append(prompt)  # batches of more than 16 rows: the Q8_0 copy
        first = s.logits().copy()
        tokens = [t.id for t in s.generate(8)]  # decode steps: the Q5_0 blocks
        logits.append((first, s.logits().copy(), tokens))
same = all(np.array_equal(a, b) for a, b in zip(logits[0][:2], logits[1][:2])) and logits[0][2] == logits[1][2]
print("same bits:", same)
"""


@pytest.mark.integration
def test_pyllamaopt_loads_q5_0_weights_widened_with_the_same_bits(gemma_path, tmp_path):
    """In a process of its own (the switch is process-wide): pyllamaopt's Gemma holds its Q5_0
    weights in the widened buffer (llama.cpp's load log, verbose on); turned off, the next model
    loads without it while the first keeps working; both give the same logits and tokens."""
    # (run outside the source tree: `python -c` imports from its working directory first)
    result = subprocess.run([sys.executable, "-c", PROBE, str(gemma_path)], capture_output=True, text=True,
                            timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = result.stderr.split("--- switch off")
    assert "CPU_Q5_0_AS_Q8_0 model buffer size" in before
    assert "CPU_Q5_0_AS_Q8_0" not in after and "model buffer size" in after
    assert "same bits: True" in result.stdout
