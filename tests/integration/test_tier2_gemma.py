"""Tier 2 on Gemma 3 270M: attention scores observed from the running model (its full-attention
layers, its attention scale) against a NumPy reference, and what sink + window and attention-sink
pruning keep of a long prompt. Quality: benchmarks/quality.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_tier2_attn import live_tokens, numpy_scores  # noqa: E402

pytestmark = pytest.mark.integration


def prompt(gemma, n):
    text = " ".join(f"Line {i}: the value of item {i} is {i * 7 % 101}." for i in range(n))
    return gemma.tokenize(text, add_bos=True)[:n]


def test_scores_come_from_the_full_attention_layers(gemma):
    tokens = prompt(gemma, 1500)
    config = OptConfig(env={}, attn_prune_enabled=True, attn_prune_threshold=0.0)
    with Context(gemma, n_ctx=2048, n_threads=2, config=config) as ctx:
        s = ctx.session()
        s.append(tokens)
        probe = s.attention_probe()
    # 5 of every 6 layers slide over 512 tokens; the others see everything
    assert probe["layers"] == [5, 11, 17]
    assert (probe["n_head"], probe["n_head_kv"], probe["head_dim"]) == (4, 1, 256)
    assert probe["scale"] == pytest.approx(1 / 16)  # Gemma 3: 1/sqrt(query_pre_attn_scalar = 256)
    np.testing.assert_allclose(probe["scores"], numpy_scores(probe), atol=1e-4, rtol=0)


def test_attn_prune_on_gemma_keeps_its_budget(gemma):
    tokens = prompt(gemma, 1500)
    config = OptConfig(env={}, attn_prune_enabled=True, attn_prune_threshold=0.0, attn_prune_budget=0.25,
                       attn_prune_recent=64, attn_prune_window=1)
    with Context(gemma, n_ctx=2048, n_threads=2, config=config) as ctx:
        s = ctx.session()
        s.append(tokens)
        s.append(gemma.tokenize(" What is the value of item 42?", add_bos=False))
        assert s.stats.attn_blocks_pruned > 0 and s.invariant_violation is None
        assert live_tokens(s) <= 0.25 * s.n_tokens + 64
        assert s.generate_text(8)  # generation goes on over the holes
