"""Re-derives, for this build and CPU, the rules of llama.cpp's batch-shape-dependent numerics
that the exactness contract stands on (../shared/DESIGN.md). A new llama.cpp or new CPU flags
can change them; when one of these tests fails, the rules in docs/exactness.md must change too.

Measured on Gemma 3 270M with a 512-token prompt, comparing final logits bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def prompt(gemma) -> list[int]:
    text = " ".join(f"Line {i}: the value of item {i} is {i * 7 % 13}." for i in range(60))
    return gemma.tokenize(text)[:512]


def logits_after(gemma, prompt, *, n_batch=512, flash_attn=True, n_threads=2, cells_before=0):
    """Logits after `prompt`, prefilled in chunks of n_batch, in a session whose KV cells
    start after `cells_before` cells held by another session."""
    with Context(gemma, n_ctx=2048, n_batch=n_batch, n_threads=n_threads, flash_attn=flash_attn) as ctx:
        other = ctx.session()  # kept open: its cells stay taken
        if cells_before:
            other.append(gemma.tokenize("word " * cells_before, add_bos=False)[:cells_before])
        session = ctx.session()
        session.append(prompt)
        return session.logits()


@pytest.mark.parametrize("flash_attn", [True, False])
def test_thread_count_never_changes_a_bit(gemma, prompt, flash_attn):
    np.testing.assert_array_equal(logits_after(gemma, prompt, n_threads=1, flash_attn=flash_attn),
                                  logits_after(gemma, prompt, n_threads=2, flash_attn=flash_attn))


@pytest.mark.parametrize("flash_attn", [True, False])
@pytest.mark.parametrize("n_batch", [64, 128, 256])
def test_block_aligned_chunks_equal_one_chunk(gemma, prompt, flash_attn, n_batch):
    np.testing.assert_array_equal(logits_after(gemma, prompt, n_batch=n_batch, flash_attn=flash_attn),
                                  logits_after(gemma, prompt, flash_attn=flash_attn))


@pytest.mark.parametrize("flash_attn", [True, False])
def test_odd_chunks_change_the_logits(gemma, prompt, flash_attn):
    # why the canonical block schedule exists: 17-token chunks are not the 512-token chunk
    diff = np.abs(logits_after(gemma, prompt, n_batch=17, flash_attn=flash_attn)
                  - logits_after(gemma, prompt, flash_attn=flash_attn))
    assert diff.max() > 1e-3


@pytest.mark.parametrize("flash_attn,aligned,misaligned", [
    (True, [64, 128, 512], [1, 16, 32, 96]),   # flash attention: cells must start 64-aligned
    (False, [16, 32, 48, 64], [1, 4, 8]),      # without: 16-aligned is enough
])
def test_cache_position_of_a_session_matters_unless_aligned(gemma, prompt, flash_attn, aligned, misaligned):
    reference = logits_after(gemma, prompt, flash_attn=flash_attn)
    for cells_before in aligned:
        np.testing.assert_array_equal(logits_after(gemma, prompt, flash_attn=flash_attn, cells_before=cells_before),
                                      reference, err_msg=f"{cells_before} cells before")
    for cells_before in misaligned:
        diff = np.abs(logits_after(gemma, prompt, flash_attn=flash_attn, cells_before=cells_before) - reference)
        assert diff.max() > 1e-3, f"{cells_before} cells before: now exact; the placement rule can be relaxed"
