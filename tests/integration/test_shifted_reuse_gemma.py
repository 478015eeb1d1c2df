"""Tier-2 post-edit reuse on Gemma 3 270M near a full KV cache (issue 23): both KV caches of the
sliding-window model (the full-attention layers' and the window layers') are moved in place,
so a history at 90 % of the context reuses its shifted spans as one at a quarter does, and stays
close to computing the edited history from scratch."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig
from test_reuse_gemma import SYSTEM, TURNS, off

pytestmark = pytest.mark.integration

N_CTX = 2048


def kl(expected, got):
    p = np.exp(expected - expected.max()); p /= p.sum()
    q = np.exp(got - got.max()); q /= q.sum()
    return float(np.sum(p * (np.log(p + 1e-30) - np.log(q + 1e-30))))


@pytest.mark.parametrize("fill", [0.25, 0.9])
def test_header_and_workspace_edits_reuse_shifted_spans_near_a_full_cache(gemma, fill):
    body = SYSTEM
    for turn in TURNS * 20:
        if len(gemma.tokenize(body + turn)) > fill * N_CTX:
            break
        body += turn
    tokens = gemma.tokenize(body)
    # a per-request header in the first line, and a workspace line rewritten longer
    edited = gemma.tokenize("Request 7f3a2, 2026-11-24.\n" + body.replace("return a - b", "return a + b  # fixed", 1))
    keep = next(i for i, (x, y) in enumerate(zip(tokens, edited)) if x != y)
    with Context(gemma, n_ctx=N_CTX, n_threads=2, config=OptConfig(env={}, diff_reuse_shifted=True)) as ctx:
        s = ctx.session()
        s.sync(tokens)
        before = s.stats
        s.sync(edited)
        spent = s.stats - before
        assert spent.diff_tokens_shifted > 0.5 * (len(edited) - keep)
        assert spent.diff_shift_fallbacks_room == spent.diff_shift_fallbacks_shared == 0
        assert spent.tokens_prefilled + spent.diff_tokens_shifted == len(edited) - keep
        assert s.invariant_violation is None
        cells = [ctx._core._test_kv_cell(s._core.seq, p) for p in range(len(edited))]
        assert all(c % 64 == p % 64 for p, c in enumerate(cells)) and all(x < y for x, y in zip(cells, cells[1:]))
        got = s.logits()
    with Context(gemma, n_ctx=N_CTX, n_threads=2, config=off()) as ctx:
        s = ctx.session()
        s.sync(edited)
        expected = s.logits()
    assert got.argmax() == expected.argmax()
    assert kl(expected, got) < 0.05  # measured 2e-3 on the agent trace (docs/benchmarks.md)
