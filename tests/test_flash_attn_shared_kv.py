"""patches/0014: flash attention's tiled prefill path converts each K/V tile once for every query
head that reads it, and must give upstream's loop's bits. The program
(tools/upstream/test-flash-attn-shared-kv.cpp) compares both, output by output, over head sizes,
grouped-query ratios, query and KV lengths, masks, ALiBi, soft-capping, sinks, F32/F16 K/V and 1-3
threads; a change of the float operations (a softmax started at another maximum: the same
mathematics, other bits) fails 66 of its 162 checks."""
from __future__ import annotations

import subprocess

import pytest
from upstream_programs import build_program

pytestmark = pytest.mark.slow


def test_the_shared_kv_tiles_give_upstreams_bits():
    program = build_program("test-flash-attn-shared-kv")
    result = subprocess.run([str(program)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "PASS: 0 of 162" in result.stdout
