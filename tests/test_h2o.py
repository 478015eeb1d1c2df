"""H2O chunked sparse prefill (Tier 2, h2o_enabled, off by default; docs/h2o.md): a prompt of more
than h2o_chunk_size tokens into an empty session is computed in chunks, each full-attention layer
attending to the chunk and to a memory set per head (the local window and the heavy hitters,
patches/0010).

Tested here on the tiny model (2 full-attention layers, 4 query heads over 2 KV heads): the
mechanics (chunks and memory-set entries counted, the approximate flag, approximate KV kept out of
the block pool, settings refused with a typed error), that a memory set holding every earlier token
gives full attention's tokens, and that a smaller one changes the computation. Quality is
benchmarks/quality.py's, never asserted."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pyllamaopt import ConfigError, Context, OptConfig
from test_reuse import reference, text_tokens

N_LAYER, N_HEAD = 2, 4  # the tiny model: both layers attend to everything


def h2o_context(model, n_batch=256, flash_attn=True, **config):
    settings = dict(h2o_enabled=True, h2o_chunk_size=128, h2o_local_window=32, h2o_heavy_budget=32)
    settings.update(config)
    return Context(model, n_ctx=4096, n_batch=n_batch, n_seq_max=8, n_threads=2, flash_attn=flash_attn,
                   config=OptConfig(env={}, **settings))


def kept_entries(n_tokens, chunk, memory):
    """Memory-set entries the chunks after the first attend to: per layer and head, min(M, tokens before)."""
    n_chunks = math.ceil(n_tokens / chunk)
    return sum(N_LAYER * N_HEAD * min(memory, c * chunk) for c in range(1, n_chunks))


def test_h2o_is_off_by_default(tiny_model):
    assert OptConfig(env={}).h2o_enabled is False
    tokens = text_tokens(tiny_model, 600)
    with Context(tiny_model, n_ctx=4096, n_batch=256, n_threads=2, config=OptConfig(env={})) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.stats.h2o_chunks == 0 and s.approx_from is None


def test_chunks_and_memory_sets_are_counted_and_the_session_is_approximate(tiny_model):
    tokens = text_tokens(tiny_model, 600)
    with h2o_context(tiny_model) as ctx:
        s = ctx.session()
        s.append(tokens)
        stats = s.stats
        assert stats.h2o_chunks == 5  # 600 tokens in chunks of 128
        assert stats.h2o_tokens_kept == kept_entries(600, 128, 64)
        assert stats.tokens_prefilled == 600 and stats.forward_passes == 5
        assert s.approx_from == 0  # approximate from the prompt's first position
        generated = [t.id for t in s.generate(4)]  # decode: full attention over every stored cell
        assert len(generated) == 4 and s.stats.h2o_chunks == 5
        # its KV never reaches the block pool: the same prompt in another session is computed again
        other = ctx.session()
        other.append(tokens)
        assert other.stats.dedup_tokens_saved == 0 and other.stats.h2o_chunks == 5


def test_a_prompt_within_one_chunk_is_computed_exactly(tiny_model):
    tokens = text_tokens(tiny_model, 128)
    with h2o_context(tiny_model) as ctx:
        s = ctx.session()
        s.append(tokens)
        got = s.logits()
        assert s.stats.h2o_chunks == 0 and s.approx_from is None
        # and a later append onto a history is full attention too (H2O applies to a fresh prompt)
        s.append(text_tokens(tiny_model, 300, seed=1))
        assert s.stats.h2o_chunks == 0 and s.approx_from is None
    expected, _ = reference(tiny_model, tokens)
    assert np.array_equal(got, expected)


def test_a_memory_set_holding_every_earlier_token_gives_full_attentions_tokens(tiny_model):
    # chunks of 128 and a memory set of 128 (L + H = S): the second chunk's memory set is the
    # whole first chunk, so the method degenerates to full attention. The H2O layers compute it
    # without flash attention over gathered cells, so the logits are close, not bitwise (docs/h2o.md).
    tokens = text_tokens(tiny_model, 256)
    with h2o_context(tiny_model, h2o_local_window=64, h2o_heavy_budget=64) as ctx:
        s = ctx.session()
        s.append(tokens)
        got = s.logits()
        generated = [t.id for t in s.generate(12)]
        assert s.stats.h2o_chunks == 2 and s.stats.h2o_tokens_kept == N_LAYER * N_HEAD * 128
    expected, expected_generated = reference(tiny_model, tokens, 12)
    print(f"\nlargest logit difference to full attention: {np.abs(got - expected).max():.3g}")
    assert generated == expected_generated
    assert np.argmax(got) == np.argmax(expected)
    np.testing.assert_allclose(got, expected, atol=1e-3 * np.abs(expected).max())


def test_a_smaller_memory_set_changes_the_computation(tiny_model):
    tokens = text_tokens(tiny_model, 512)
    with h2o_context(tiny_model, h2o_local_window=16, h2o_heavy_budget=16) as ctx:
        s = ctx.session()
        s.append(tokens)
        got = s.logits()
        assert s.stats.h2o_chunks == 4 and s.stats.h2o_tokens_kept == kept_entries(512, 128, 32)
    expected, _ = reference(tiny_model, tokens)
    assert np.abs(got - expected).max() > 1e-3  # the subsets are applied: attention is sparse


@pytest.mark.parametrize("settings, variable", [
    (dict(h2o_local_window=100, h2o_heavy_budget=100), "LLAMA_OPT_H2O_CHUNK_SIZE"),  # M > S
    (dict(h2o_chunk_size=512), "n_batch"),                                          # S beyond one llama_decode call
    (dict(attn_prune_enabled=True), "attn_prune_enabled"),
])
def test_settings_h2o_cannot_work_with_are_refused(tiny_model, settings, variable):
    with pytest.raises(ConfigError, match=variable):
        h2o_context(tiny_model, **settings)


def test_h2o_needs_flash_attention(tiny_model):
    with pytest.raises(ConfigError, match="flash_attn=True"):
        h2o_context(tiny_model, flash_attn=False)
