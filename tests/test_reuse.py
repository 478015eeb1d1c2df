"""Exact KV reuse on the tiny model: the canonical schedule, prefix reuse in sync, block sharing
across sessions (dedup), fork, the cache of closed sessions, eviction. Every reuse is checked
against a from-scratch computation, bit for bit."""
from __future__ import annotations

import random

import numpy as np
import pytest

from pyllamaopt import Context, ContextOverflowError, OptConfig, SessionEvictedError

WORDS = "the code file has a function that will return a value to the test of python paris".split()


def text_tokens(model, n, seed=0):
    rng = random.Random(seed)
    tokens = model.tokenize(" ".join(rng.choice(WORDS) for _ in range(n)))
    assert len(tokens) >= n
    return tokens[:n]


def context(model, **config):
    return Context(model, n_ctx=4096, n_batch=256, n_seq_max=8, n_threads=2, config=OptConfig(env={}, **config))


def reference(model, tokens, n_generate=0):
    """Logits (and greedy continuation) of `tokens` computed from scratch, reuse off."""
    with context(model, dedup_enabled=False, diff_enabled=False) as ctx:
        s = ctx.session()
        s.append(tokens)
        logits = s.logits()
        return logits, [t.id for t in s.generate(n_generate)]


def ids(generation):
    return [t.id for t in generation]


def test_history_built_in_pieces_equals_one_call(tiny_model):
    tokens = text_tokens(tiny_model, 700)
    expected_logits, expected_tokens = reference(tiny_model, tokens, 12)
    rng = random.Random(1)
    with context(tiny_model) as ctx:
        for trial in range(6):
            cuts = sorted(rng.sample(range(1, len(tokens)), trial))
            s = ctx.session()
            for start, stop in zip([0] + cuts, cuts + [len(tokens)]):
                s.append(tokens[start:stop])
            np.testing.assert_array_equal(s.logits(), expected_logits, err_msg=f"cuts {cuts}")
            assert ids(s.generate(12)) == expected_tokens
            s.close()


def test_generated_tokens_are_recomputed_canonically(tiny_model):
    """A turn's answer becomes part of the next prompt: the result equals prefilling the whole
    conversation at once, although the answer's KV first came from one-token decode steps."""
    prompt = text_tokens(tiny_model, 300)
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(prompt)
        answer = ids(s.generate(40))
        follow_up = text_tokens(tiny_model, 30, seed=5)
        s.append(follow_up)
        expected_logits, expected_tokens = reference(tiny_model, prompt + answer + follow_up, 10)
        np.testing.assert_array_equal(s.logits(), expected_logits)
        assert ids(s.generate(10)) == expected_tokens


@pytest.mark.parametrize("diff_enabled", [True, False])
def test_sync_keeps_the_common_prefix_exactly(tiny_model, diff_enabled):
    first = text_tokens(tiny_model, 600)
    second = first[:462] + text_tokens(tiny_model, 100, seed=9)
    with context(tiny_model, diff_enabled=diff_enabled, dedup_enabled=False) as ctx:
        s = ctx.session()
        s.sync(first)
        before = s.stats
        s.sync(second)
        spent = s.stats - before
        if diff_enabled:  # kept: the common prefix, down to a multiple of 4 (the canonical row groups)
            assert spent.tokens_prefilled == len(second) - 460
            assert spent.diff_tokens_unchanged == 460
        else:
            assert spent.tokens_prefilled == len(second)
        expected_logits, expected_tokens = reference(tiny_model, second, 10)
        np.testing.assert_array_equal(s.logits(), expected_logits)
        assert ids(s.generate(10)) == expected_tokens


def test_sessions_share_the_blocks_of_a_common_prefix(tiny_model):
    system = text_tokens(tiny_model, 640)
    questions = [text_tokens(tiny_model, 40 + 10 * i, seed=100 + i) for i in range(4)]
    with context(tiny_model) as ctx:
        sessions = [ctx.session() for _ in questions]
        for s, q in zip(sessions, questions):
            s.append(system + q)
        stats = ctx.stats
        block = ctx.block_size
        shared_blocks = (len(system)) // block  # the last chunk always holds >= min_chunk tokens
        assert stats.dedup_blocks_hit >= 3 * (shared_blocks - 1)
        assert stats.dedup_tokens_saved == stats.dedup_blocks_hit * block
        # KV stored once: shared prefix + each session's own tail (whole tiles)
        own = sum(len(system) + len(q) - (len(system) // block - 1) * block for q in questions[1:])
        assert ctx.kv_cells_used <= len(system) + len(questions[0]) + own + 4 * block
        for s, q in zip(sessions, questions):
            expected_logits, expected_tokens = reference(tiny_model, system + q, 8)
            np.testing.assert_array_equal(s.logits(), expected_logits)
            assert ids(s.generate(8)) == expected_tokens


def test_canon_stores_a_recomputed_shared_block_once(tiny_model):
    """A session whose own suffix is shorter than the last chunk computes the end of the shared
    prefix again; kv-canon drops that copy and shares the other session's cells instead."""
    system = text_tokens(tiny_model, 640)
    questions = [text_tokens(tiny_model, 12, seed=200 + i) for i in range(4)]
    used = {}
    for canon in (False, True):
        with context(tiny_model, canon_enabled=canon) as ctx:
            sessions = [ctx.session() for _ in questions]
            for s, q in zip(sessions, questions):
                s.append(system + q)
            used[canon] = ctx.kv_cells_used
            stats = ctx.stats
            if canon:
                assert stats.canon_entries_deduped >= len(questions) - 1
                assert stats.canon_bytes_saved == stats.canon_entries_deduped * ctx.block_size * tiny_model.kv_bytes_per_token
            else:
                assert stats.canon_entries_deduped == 0
            for s, q in zip(sessions, questions):
                expected_logits, expected_tokens = reference(tiny_model, system + q, 8)
                np.testing.assert_array_equal(s.logits(), expected_logits)
                assert ids(s.generate(8)) == expected_tokens
    assert used[True] <= used[False] - (len(questions) - 1) * 64


def test_forced_hash_collisions_are_misses_never_wrong_kv(tiny_model):
    block_tokens = text_tokens(tiny_model, 128, seed=3)
    a = text_tokens(tiny_model, 64, seed=1) + block_tokens + text_tokens(tiny_model, 70, seed=4)
    b = text_tokens(tiny_model, 64, seed=2) + block_tokens + text_tokens(tiny_model, 70, seed=4)
    with context(tiny_model) as ctx:
        ctx._core._set_test_hash_mask(0)  # every block hashes to 0
        sa, sb = ctx.session(), ctx.session()
        sa.append(a)
        sb.append(b)  # same tokens at the same positions after a different first block: a miss
        assert ctx.stats.dedup_blocks_hit == 0
        sc = ctx.session()
        sc.append(a[:200] + text_tokens(tiny_model, 90, seed=8))  # the same prefix as a: real hits
        assert ctx.stats.dedup_blocks_hit >= 2
        for s, tokens in ((sb, b), (sc, sc.tokens)):
            np.testing.assert_array_equal(s.logits(), reference(tiny_model, tokens)[0])


def test_fork_shares_the_history(tiny_model):
    prompt = text_tokens(tiny_model, 500)
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(prompt)
        used = ctx.kv_cells_used
        twin = s.fork()
        assert twin.tokens == s.tokens
        assert ctx.kv_cells_used - used < 2 * ctx.block_size  # only the last chunk is its own
        assert ids(twin.generate(10)) == ids(s.generate(10))
        assert twin.stats.tokens_prefilled < 2 * ctx.block_size


def test_closed_sessions_stay_cached_until_room_is_needed(tiny_model):
    system = text_tokens(tiny_model, 512)
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(system + text_tokens(tiny_model, 20, seed=1))
        s.close()
        assert ctx.n_cached == 1 and ctx.n_sessions == 0
        t = ctx.session()
        t.append(system + text_tokens(tiny_model, 30, seed=2))
        assert t.stats.dedup_tokens_saved >= len(system) - ctx.block_size
        np.testing.assert_array_equal(t.logits(), reference(tiny_model, t.tokens)[0])


def test_idle_sessions_are_evicted_least_recently_used_first(tiny_model):
    with Context(tiny_model, n_ctx=1024, n_batch=256, n_seq_max=8, n_threads=2) as ctx:
        sessions = []
        for i in range(3):
            s = ctx.session()
            s.append(text_tokens(tiny_model, 300, seed=20 + i))
            sessions.append(s)
        sessions[0].append(text_tokens(tiny_model, 10, seed=30))  # now sessions[1] is the oldest
        newest = ctx.session()
        newest.append(text_tokens(tiny_model, 200, seed=40))   # does not fit: someone must go
        assert sessions[1].evicted and sessions[1].closed
        assert not sessions[0].evicted and not sessions[2].evicted
        assert ctx.stats.sessions_evicted >= 1
        with pytest.raises(SessionEvictedError, match="evicted"):
            sessions[1].append([5])
        np.testing.assert_array_equal(newest.logits(), reference(tiny_model, newest.tokens)[0])


def test_cached_sequences_go_before_sessions(tiny_model):
    with Context(tiny_model, n_ctx=1024, n_batch=256, n_seq_max=8, n_threads=2) as ctx:
        old = ctx.session()
        old.append(text_tokens(tiny_model, 400, seed=1))
        old.close()
        live = ctx.session()
        live.append(text_tokens(tiny_model, 300, seed=2))
        more = ctx.session()
        more.append(text_tokens(tiny_model, 500, seed=3))
        assert ctx.stats.dedup_sequences_evicted == 1
        assert ctx.stats.sessions_evicted == 0 and not live.evicted


def test_a_full_pool_only_limits_sharing(tiny_model):
    system = text_tokens(tiny_model, 640)
    with context(tiny_model, dedup_pool_max=3) as ctx:
        a, b = ctx.session(), ctx.session()
        a.append(system + [5, 6, 7])
        b.append(system + [8, 9])
        assert ctx.stats.dedup_tokens_saved <= 3 * ctx.block_size
        np.testing.assert_array_equal(b.logits(), reference(tiny_model, b.tokens)[0])


def test_seeded_sampling_is_reproduced_with_reuse(tiny_model):
    prompt = text_tokens(tiny_model, 400)
    outputs = []
    for config in ({}, {"dedup_enabled": False, "diff_enabled": False}):
        with context(tiny_model, **config) as ctx:
            warm = ctx.session()
            warm.append(prompt + [7])
            s = ctx.session()
            s.sync(prompt)
            outputs.append(ids(s.generate(20, temperature=0.9, seed=1234)))
    assert outputs[0] == outputs[1]


def test_peeking_at_the_logits_does_not_change_the_generation(tiny_model):
    prompt = text_tokens(tiny_model, 300)
    with context(tiny_model) as ctx:
        plain, peeking = ctx.session(), ctx.session()
        plain.append(prompt)
        peeking.append(prompt)
        expected = ids(plain.generate(20, temperature=0.9, seed=3))
        got = []
        for token in peeking.generate(20, temperature=0.9, seed=3):
            got.append(token.id)
            peeking.logits()
        assert got == expected


def test_an_emptied_history_has_no_logits(tiny_model):
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(text_tokens(tiny_model, 100))
        assert s.logits().size == tiny_model.n_vocab
        s.sync([])
        assert s.logits().size == 0


def test_an_overflowing_append_leaves_the_session_exact(tiny_model):
    """The append is refused, and the session still computes exactly what a fresh session
    computes for its history."""
    with Context(tiny_model, n_ctx=1024, n_batch=256, n_seq_max=4, n_threads=2) as ctx:
        s = ctx.session()
        s.append(text_tokens(tiny_model, 300, seed=1))
        with pytest.raises(ContextOverflowError):
            s.append(text_tokens(tiny_model, 800, seed=2))  # 1100 tokens > n_ctx
        assert s.n_tokens == 300
        s.append(text_tokens(tiny_model, 20, seed=3))
        np.testing.assert_array_equal(s.logits(), reference(tiny_model, s.tokens)[0])


def test_a_generation_dropped_unfinished_ends_its_turn_at_once(tiny_model):
    """A generation the caller drops without finishing or closing it ends its session's turn when
    its last reference goes (not when the garbage collector runs): the session is idle again and
    evictable for room."""
    import gc
    gc.disable()  # only reference counting may free it
    try:
        with Context(tiny_model, n_ctx=1024, n_batch=256, n_seq_max=8, n_threads=2) as ctx:
            dropped = ctx.session()
            dropped.append(text_tokens(tiny_model, 900, seed=50))
            generation = dropped.generate(max_tokens=50)
            next(generation)
            del generation
            newest = ctx.session()
            newest.append(text_tokens(tiny_model, 200, seed=51))  # fits only if `dropped` goes
            assert dropped.evicted
    finally:
        gc.enable()
