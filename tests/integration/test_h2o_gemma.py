"""H2O chunked sparse prefill on Gemma 3 270M (docs/h2o.md): its 3 full-attention layers (5, 11, 17)
attend to memory sets, its 15 sliding-window layers keep their 512-token window. With a memory set
that holds every earlier token the method degenerates to full attention: the strongest correctness
test (same tokens; the logits are not bitwise, docs/h2o.md says why). Quality: benchmarks/quality.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_tier2_gemma import prompt  # noqa: E402

pytestmark = pytest.mark.integration


def run(gemma, tokens, n_generate, **config):
    with Context(gemma, n_ctx=4096, n_batch=512, n_threads=2, config=OptConfig(env={}, **config)) as ctx:
        s = ctx.session()
        s.append(tokens)
        logits = s.logits()
        generated = [t.id for t in s.generate(n_generate)]
        return logits, generated, s.stats, s.approx_from


def test_a_memory_set_of_every_earlier_token_gives_exact_prefills_tokens(gemma):
    # S = 512, L = H = 256: the second chunk's memory set is the whole first chunk
    tokens = prompt(gemma, 1024)
    logits, generated, stats, approx_from = run(gemma, tokens, 16, h2o_enabled=True, h2o_chunk_size=512,
                                                h2o_local_window=256, h2o_heavy_budget=256)
    expected_logits, expected, _, _ = run(gemma, tokens, 16)
    assert stats.h2o_chunks == 2 and stats.h2o_tokens_kept == 3 * 4 * 512 and approx_from == 0
    print(f"\nlargest logit difference to exact prefill: {np.abs(logits - expected_logits).max():.3g}")
    assert generated == expected


def test_h2o_over_many_chunks_keeps_every_token_for_decode(gemma):
    tokens = prompt(gemma, 2500)
    logits, generated, stats, approx_from = run(gemma, tokens, 8, h2o_enabled=True, h2o_chunk_size=512,
                                                h2o_local_window=128, h2o_heavy_budget=128)
    assert stats.h2o_chunks == 5 and approx_from == 0
    assert stats.h2o_tokens_kept == 3 * 4 * 256 * 4  # chunks 2-5: a full memory set per layer and head
    assert stats.tokens_prefilled == 2500 and np.isfinite(logits).all() and len(generated) == 8
