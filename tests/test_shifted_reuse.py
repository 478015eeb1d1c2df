"""Tier 2 post-edit reuse (diff_reuse_shifted) on the tiny model: after an edit, the KV of the
unchanged spans that follow it is moved to their new positions (K re-rotated) instead of being
computed again. Approximate by design: its quality on a real model is measured by
benchmarks/agent_trace.py. Tested here: the work it saves, that it is close to the exact
result, and that it never leaks into what is promised exact (other sessions, the block pool,
forks, a later exact history)."""
from __future__ import annotations

import math

import numpy as np

from pyllamaopt import Context, OptConfig
from test_reuse import context, ids, reference, text_tokens

SHARE = 0.25


def edited_histories(model):
    """A 700-token history, and the same with 37 tokens inserted after position 200."""
    a = text_tokens(model, 700)
    b = a[:200] + text_tokens(model, 37, seed=7) + a[200:]
    return a, b


def tier2(model, flash_attn=True):
    return Context(model, n_ctx=4096, n_batch=256, n_seq_max=8, n_threads=2, flash_attn=flash_attn,
                   config=OptConfig(env={}, diff_reuse_shifted=True, diff_recompute_share=SHARE))


def work_of_edit(session, a, b):
    """The counters of syncing `session` from history `a` to its edited version `b`."""
    session.sync(a)
    before = session.stats
    session.sync(b)
    return session.stats - before


def test_shifted_reuse_computes_the_edit_and_a_share_of_each_span(tiny_model):
    a, b = edited_histories(tiny_model)
    with tier2(tiny_model) as ctx:
        s = ctx.session()
        spent = work_of_edit(s, a, b)
        # the span after the insertion: its first quarter is computed again (at least up to the end
        # of the block the edit is in), the rest moved by 37 positions, except the last token
        again = max(math.ceil(SHARE * 500), 256 - 200)
        moved = 500 - again - 1
        assert spent.diff_tokens_shifted == moved
        assert spent.tokens_prefilled == 37 + again + 1
        assert spent.diff_tokens_unchanged == len(b) - spent.tokens_prefilled
        assert s.approx_from == 200
        expected = reference(tiny_model, b)[0]
        got = s.logits()
        assert got.argmax() == expected.argmax()
        # measured 0.19; 0.43 when the moved K rows are not rotated to their new positions
        assert np.abs(got - expected).max() < 0.35


def test_the_tokens_between_shifted_spans_are_computed_in_one_series_of_batches(tiny_model):
    """Two insertions: the spans after each join the session first, then the inserted tokens, the
    share of each span and the last token are computed together at their positions (patches/0012),
    in one pass here (179 tokens, batches of 256) where a pass per gap took three."""
    a = text_tokens(tiny_model, 700)
    b = a[:150] + text_tokens(tiny_model, 20, seed=7) + a[150:450] + text_tokens(tiny_model, 20, seed=8) + a[450:]
    with tier2(tiny_model) as ctx:
        s = ctx.session()
        spent = work_of_edit(s, a, b)
        again = [max(math.ceil(SHARE * 300), 192 - 150), math.ceil(SHARE * 250)]  # each span's share
        assert spent.tokens_prefilled == 20 + again[0] + 20 + again[1] + 1
        assert spent.diff_tokens_shifted == 300 - again[0] + 250 - again[1] - 1
        assert spent.forward_passes == 1
        assert s.approx_from == 150
        expected_logits, expected_tokens = reference(tiny_model, b, 8)
        got = s.logits()
        assert got.argmax() == expected_logits.argmax()
        assert np.abs(got - expected_logits).max() < 0.35  # measured 0.17, as with a pass per gap
        assert ids(s.generate(8)) == expected_tokens


def test_an_edit_in_the_first_block_computes_a_larger_share_again(tiny_model):
    """A per-request header in the first line changes the attention sinks every later token
    attends to: the default share there is diff_recompute_share_head, elsewhere the smaller
    diff_recompute_share (measured: docs/benchmarks.md, "The head share")."""
    config = OptConfig(env={}, diff_reuse_shifted=True)
    assert config.diff_recompute_share < config.diff_recompute_share_head
    a = text_tokens(tiny_model, 700)
    edits = {  # 11 tokens replaced by 14 at: (where, the share expected)
        "header": (1, config.diff_recompute_share_head),
        "interior": (300, config.diff_recompute_share),
    }
    for name, (at, share) in edits.items():
        b = a[:at] + text_tokens(tiny_model, 14, seed=7) + a[at + 11:]
        with Context(tiny_model, n_ctx=4096, n_batch=256, n_threads=2, config=config) as ctx:
            s = ctx.session()
            s.sync(a)
            before = s.stats
            s.sync(b)
            spent = s.stats - before
        span = len(a) - (at + 11)
        rest_of_the_edits_block = (at + 63) // 64 * 64 - (at + 11)
        again = max(math.ceil(share * span), rest_of_the_edits_block)
        assert spent.tokens_prefilled == 14 + again + 1, name
        assert spent.diff_tokens_shifted == span - again - 1, name


def test_tier2_is_off_by_default(tiny_model):
    a, b = edited_histories(tiny_model)
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.sync(a)
        s.sync(b)
        assert s.stats.diff_tokens_shifted == 0
        assert s.approx_from is None
        np.testing.assert_array_equal(s.logits(), reference(tiny_model, b)[0])


def test_other_sessions_stay_exact_while_one_reuses_shifted_spans(tiny_model):
    """Moving KV rotates K of the whole cache at the next step (by 0 for other cells)."""
    a, b = edited_histories(tiny_model)
    mine = text_tokens(tiny_model, 300, seed=11)
    more = text_tokens(tiny_model, 80, seed=12)
    with tier2(tiny_model) as ctx:
        exact, approximate = ctx.session(), ctx.session()
        exact.append(mine)
        approximate.sync(a)
        approximate.sync(b)
        assert approximate.stats.diff_tokens_shifted > 0
        exact.append(more)
        expected_logits, expected_tokens = reference(tiny_model, mine + more, 10)
        np.testing.assert_array_equal(exact.logits(), expected_logits)
        assert ids(exact.generate(10)) == expected_tokens


def test_approximate_kv_is_never_shared(tiny_model):
    a, b = edited_histories(tiny_model)
    expected_logits, expected_tokens = reference(tiny_model, b, 8)
    with tier2(tiny_model) as ctx:
        approximate = ctx.session()
        approximate.sync(a)
        approximate.sync(b)
        fresh = ctx.session()
        fresh.append(b)  # may share the exact blocks before the edit, nothing after it
        assert fresh.stats.dedup_tokens_saved <= 200
        np.testing.assert_array_equal(fresh.logits(), expected_logits)
        twin = approximate.fork()
        assert twin.approx_from is None
        np.testing.assert_array_equal(twin.logits(), expected_logits)
        assert ids(twin.generate(8)) == expected_tokens
        approximate.close()  # its cached blocks: the exact ones only
        late = ctx.session()
        late.append(b)
        np.testing.assert_array_equal(late.logits(), expected_logits)


def test_an_approximate_session_appends_without_recomputing(tiny_model):
    a, b = edited_histories(tiny_model)
    tail = text_tokens(tiny_model, 50, seed=13)
    with tier2(tiny_model) as ctx:
        s = ctx.session()
        s.sync(a)
        s.sync(b)
        before = s.stats
        s.append(tail)
        assert (s.stats - before).tokens_prefilled == len(tail)
        assert s.logits().argmax() == reference(tiny_model, b + tail)[0].argmax()


def test_cutting_before_the_edit_makes_the_session_exact_again(tiny_model):
    a, b = edited_histories(tiny_model)
    with tier2(tiny_model) as ctx:
        s = ctx.session()
        s.sync(a)
        s.sync(b)
        s.sync(b[:150])
        assert s.approx_from is None
        s.append(b[150:])
        np.testing.assert_array_equal(s.logits(), reference(tiny_model, b)[0])


def test_without_flash_attention_the_spans_are_computed_instead(tiny_model):
    """V is stored transposed then, which the move does not support: nothing is reused shifted."""
    a, b = edited_histories(tiny_model)
    with tier2(tiny_model, flash_attn=False) as ctx:
        s = ctx.session()
        s.sync(a)
        before = s.stats
        s.sync(b)
        assert (s.stats - before).diff_tokens_shifted == 0
        assert (s.stats - before).tokens_prefilled == len(b) - 200
