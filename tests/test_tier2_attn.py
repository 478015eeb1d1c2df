"""Tier 2 methods that take KV out of attention (off by default): Session.drop_span (the sink +
window baseline), attention scores from the running model (attention_probe), attention-sink
pruning (attn_prune_enabled) and sparse attention over tool results (sparse_attn_enabled).

Tested here: the mechanics (what is kept, what is dropped, the counters, the approximate flag,
that approximate KV never reaches other sessions, forks or the block pool) and the scores
against a NumPy reference. Their quality is measured by benchmarks/quality.py, not asserted."""
from __future__ import annotations

import random

import numpy as np
import pytest

from pyllamaopt import Context, InvalidArgumentError, OptConfig, PersistStore
from test_reuse import reference, text_tokens
from tinymodel import WORDS

B = 64  # block size


def context(model, **config):
    return Context(model, n_ctx=4096, n_batch=256, n_seq_max=8, n_threads=2, config=OptConfig(env={}, **config))


def observing(model, **config):
    """A context that observes the model's queries; threshold 0 and no budget prune nothing."""
    return context(model, attn_prune_enabled=True, attn_prune_threshold=0.0, **config)


def numpy_scores(probe):
    """001's host-side scoring from the probe's own Q and K: GQA head mapping, the model's scale,
    softmax over the keys each query sees, max over heads, mean over queries, mean over layers."""
    q, k = probe["q"].astype(np.float64), probe["k"].astype(np.float64)
    group = probe["n_head"] // probe["n_head_kv"]
    visible = probe["k_pos"][None, :] <= probe["q_pos"][:, None]  # queries × keys
    total = np.zeros(len(probe["k_pos"]))
    for layer in range(len(probe["layers"])):
        heads = []
        for h in range(probe["n_head"]):
            z = q[layer, :, h, :] @ k[layer, :, h // group, :].T * probe["scale"]  # queries × keys
            z = np.where(visible, z, -np.inf)
            z = np.exp(z - z.max(axis=1, keepdims=True))
            heads.append(z / z.sum(axis=1, keepdims=True))
        total += np.max(heads, axis=0).mean(axis=0)
    return total / len(probe["layers"])


def test_attention_scores_equal_a_numpy_reference(tiny_model):
    tokens = text_tokens(tiny_model, 300)
    with observing(tiny_model) as ctx:
        s = ctx.session()
        s.append(tokens)
        probe = s.attention_probe()
    n_queries = 16  # attn_prune_queries: the last tokens of the append
    assert probe["layers"] == [0, 1]  # no sliding window: every layer attends to everything
    assert probe["q"].shape == (2, n_queries, 4, 16) and probe["k"].shape == (2, 300, 2, 16)
    assert list(probe["q_pos"]) == list(range(300 - n_queries, 300)) and list(probe["k_pos"]) == list(range(300))
    assert probe["scale"] == pytest.approx(1 / 4)  # 1/sqrt(head_dim)
    assert np.abs(probe["q"]).max() > 0 and np.abs(probe["k"]).max() > 0
    np.testing.assert_allclose(probe["scores"], numpy_scores(probe), atol=1e-4, rtol=0)
    # every query's softmax sums to 1 per head, so the head-max sums to at least 1
    assert probe["scores"].sum() >= 1 - 1e-4


def test_observing_the_queries_changes_no_bit(tiny_model):
    tokens = text_tokens(tiny_model, 500)
    with observing(tiny_model) as ctx:
        s = ctx.session()
        s.append(tokens)
        got = s.logits()
        generated = [t.id for t in s.generate(8)]
        stats = s.stats
    expected, expected_generated = reference(tiny_model, tokens, 8)
    assert np.array_equal(got, expected) and generated == expected_generated
    assert stats.attn_keys_scored == 500 and stats.attn_blocks_pruned == 0
    assert stats.attn_score_us > 0


def test_drop_span_frees_cells_and_makes_the_session_approximate(tiny_model):
    tokens = text_tokens(tiny_model, 700)
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(tokens)
        used = ctx.kv_cells_used
        s.drop_span(B, 500)
        assert s.holes == [(B, 500)] and s.approx_from == B
        assert ctx.kv_cells_used == used - (500 - B)
        assert s.invariant_violation is None
        approximate = s.logits()
        assert not np.array_equal(approximate, reference(tiny_model, tokens)[0])
        s.append(text_tokens(tiny_model, 40, seed=3))
        assert s.holes == [(B, 500)] and s.invariant_violation is None
        # nothing approximate leaves the session: a fork computes what is past the exact prefix
        f = s.fork()
        assert f.approx_from is None and f.holes == []
        assert np.array_equal(f.logits(), reference(tiny_model, f.tokens)[0])
        # the last token always keeps its KV
        s.drop_span(0, 10**6)
        n = s.n_tokens
        assert s.holes == [(0, n - 1)] and s.invariant_violation is None
        s.generate_text(4)
        # cutting the history back before the first hole makes it exact again
        s.sync(tokens[:50])
        assert s.holes == [] and s.approx_from is None
        assert np.array_equal(s.logits(), reference(tiny_model, tokens[:50])[0])
        s.close()
        # its blocks in the pool are exact ones only: a new session with the whole history
        t = ctx.session()
        t.append(tokens)
        assert np.array_equal(t.logits(), reference(tiny_model, tokens)[0])


def test_drop_span_refuses_bad_bounds(tiny_model):
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(text_tokens(tiny_model, 100))
        with pytest.raises(InvalidArgumentError):
            s.drop_span(50, 10)
        with pytest.raises(InvalidArgumentError):
            s.drop_span(-1, 10)
        assert s.holes == [] and s.approx_from is None


def test_tier2_methods_are_off_by_default(tiny_model):
    tokens = text_tokens(tiny_model, 600)
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(tokens[:100], kind="system")
        s.append(tokens[100:500], kind="tool")
        s.append(tokens[500:])
        assert s.holes == [] and s.approx_from is None and s.n_cold == 0
        assert np.array_equal(s.logits(), reference(tiny_model, tokens)[0])
        with pytest.raises(InvalidArgumentError, match="attn_prune_enabled"):
            s.attention_probe()
        with pytest.raises(InvalidArgumentError, match="kind"):
            s.append(tokens[:3], kind="user")


def live_tokens(session):
    return session.n_tokens - sum(b - a for a, b in session.holes)


def test_attn_prune_keeps_the_budget_and_never_the_guarded_blocks(tiny_model):
    system, body, query = text_tokens(tiny_model, 100), text_tokens(tiny_model, 1000, seed=1), \
        text_tokens(tiny_model, 20, seed=2)
    with observing(tiny_model, attn_prune_budget=0.25, attn_prune_recent=B, attn_prune_window=1) as ctx:
        s = ctx.session()
        s.append(system, kind="system")
        s.append(body)
        assert s.holes == []  # the current turn is never pruned
        s.append(query)
        stats, n = s.stats, s.n_tokens
        assert stats.attn_blocks_pruned > 0 and stats.attn_tokens_pruned == stats.attn_blocks_pruned * B
        assert s.n_cold == stats.attn_tokens_pruned == sum(b - a for a, b in s.holes)
        for a, b in s.holes:
            assert a % B == 0 and b % B == 0
            assert a >= 2 * B  # the first block (attention sinks) and the system prompt (blocks 0, 1)
            assert b <= 1100  # the current turn
        assert live_tokens(s) <= 0.25 * n + B
        assert s.approx_from == s.holes[0][0]
        assert s.invariant_violation is None


def test_attn_prune_restores_blocks_bitwise(tiny_model):
    """Over turns whose queries attend elsewhere, cold blocks come back; the K rows of the first
    turn's blocks that are in the KV (never pruned, or restored) are those of an exact session."""
    body = text_tokens(tiny_model, 1200, seed=1)
    with observing(tiny_model, attn_prune_budget=0.5, attn_prune_recent=B, attn_prune_window=1) as ctx:
        s = ctx.session()
        s.append(body)
        for turn in range(8):
            s.append(text_tokens(tiny_model, 24, seed=10 + turn))
            assert live_tokens(s) <= 0.5 * s.n_tokens + B and s.invariant_violation is None
        stats = s.stats
        probe = s.attention_probe()
        exact = ctx.session()
        exact.append(body)
        exact_probe = exact.attention_probe()
    assert stats.attn_blocks_restored > 0 and stats.attn_tokens_restored == stats.attn_blocks_restored * B
    assert stats.attn_tokens_recomputed > 0
    first_turn = probe["k_pos"] < len(body) - len(body) % B
    positions = probe["k_pos"][first_turn]
    assert np.array_equal(probe["k"][:, first_turn], exact_probe["k"][:, positions])


def test_sparse_tool_drops_irrelevant_spans_and_keeps_the_edges(tiny_model):
    tok = lambda text: tiny_model.tokenize(text, add_bos=False)  # noqa: E731
    asked = {"what", "is", "the", "capital", "of", "france", "paris", "and", "italy"}
    rng = random.Random(4)
    filler = tok(" ".join(rng.choice([w for w in WORDS if w not in asked]) for _ in range(700)))[:640]
    needle = tok(" capital france paris capital france paris")
    tool = filler[:320] + needle + filler[320:]
    with context(tiny_model, sparse_attn_enabled=True, sparse_attn_keep_edges=32, sparse_attn_span=32) as ctx:
        s = ctx.session()
        s.append(text_tokens(tiny_model, 50, seed=5))
        s.append(tool, kind="tool")
        assert s.holes == []  # scored when the query comes
        start = 50
        s.append(tok(" what is the capital of france"))
        holes, stats = s.holes, s.stats
        assert holes and stats.sparse_tokens_dropped == sum(b - a for a, b in holes)
        assert stats.sparse_spans_dropped >= len(holes)
        for a, b in holes:
            assert a >= start + 32 and b <= start + len(tool) - 32  # the first and last tokens stay
            assert b <= start + 320 or a >= start + 320 + len(needle)  # the span the query names stays
        assert s.approx_from == holes[0][0] and s.invariant_violation is None
        # scored once: a later query drops nothing more
        s.append(tok(" and of italy"))
        assert s.holes == holes


def test_session_settings_override_the_context_and_forks_keep_them(tiny_model):
    tok = lambda text: tiny_model.tokenize(text, add_bos=False)  # noqa: E731
    rng = random.Random(6)
    tool = tok(" ".join(rng.choice([w for w in WORDS if w not in {"capital", "france"}]) for _ in range(500)))[:400]
    with context(tiny_model) as ctx:  # the context: nothing of Tier 2
        base = ctx.session()
        base.append(text_tokens(tiny_model, 30, seed=5))
        base.append(tool, kind="tool")
        sparse = base.fork()  # keeps the tool result's span
        sparse.configure_tier2(sparse_attn_enabled=True, sparse_attn_keep_edges=16, sparse_relevance_threshold=0.5)
        plain = base.fork()
        sparse.append(tok(" capital france"))
        plain.append(tok(" capital france"))
        assert sparse.holes and sparse.stats.sparse_tokens_dropped > 0
        assert plain.holes == [] and np.array_equal(plain.logits(), reference(tiny_model, plain.tokens)[0])
        with pytest.raises(InvalidArgumentError, match="attn_prune_enabled"):
            plain.configure_tier2(attn_prune_enabled=True)  # the context observes no queries
        with pytest.raises(InvalidArgumentError, match="attn_prune_"):
            plain.configure_tier2(dedup_enabled=False)


def test_a_session_with_a_hole_persists_only_its_exact_prefix(tiny_model, tmp_path):
    tokens = text_tokens(tiny_model, 700)
    # written on save (behind, the prompt's exact KV is on disk before the hole is made: exact too)
    with context(tiny_model, persist_enabled=True, persist_dir=str(tmp_path / "kv"), persist_write_behind=False) as ctx:
        s = ctx.session()
        s.append(tokens)
        s.drop_span(130, 500)
        assert s.save() == 2 * B  # the complete blocks before the hole
        s.discard()
        t = ctx.session()
        t.append(tokens)
        assert t.stats.persist_tokens_restored <= 2 * B
        assert np.array_equal(t.logits(), reference(tiny_model, tokens)[0])


def test_the_writer_behind_stores_no_approximate_kv(tiny_model, tmp_path):
    """With the disk tier written behind (the default), a session with a hole goes on computing (an
    append, an answer, a sync): that KV attends to a history with a hole, and the writer takes only
    the blocks below n_canonical, so no entry holds any of it (the prompt's own blocks, computed
    before the hole, are on disk: exact). A fresh context restores the longest prefix it finds and
    gives, bit for bit, the logits of a full recompute."""
    tokens = text_tokens(tiny_model, 700)
    kv = tmp_path / "kv"
    with context(tiny_model, persist_enabled=True, persist_dir=str(kv)) as ctx:
        s = ctx.session()
        s.append(tokens)
        s.drop_span(130, 500)
        s.append(text_tokens(tiny_model, 300, seed=3))
        s.generate_text(20)
        history = s.tokens + text_tokens(tiny_model, 100, seed=4)
        s.sync(history)
        assert s.holes == [(130, 500)] and s.invariant_violation is None
        s.close()  # (a closing session writes behind what it has not yet)
    assert [e.n_tokens for e in PersistStore(kv).entries()] == [640]  # the prompt's complete blocks
    with context(tiny_model, persist_enabled=True, persist_dir=str(kv)) as fresh:
        t = fresh.session()
        t.append(history)
        assert t.stats.persist_tokens_restored == 640
        assert np.array_equal(t.logits(), reference(tiny_model, history)[0])
