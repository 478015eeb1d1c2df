"""Tier 2 post-edit reuse (diff_reuse_shifted) at any fill level of the KV cache (issue 23).

The rows of the unchanged spans after an edit are moved within the session's own cells (like
memmove, patches/0005), so a move needs no room for a second copy of the span: the edits of an
agent's prompt (a line that gets longer or shorter, several edits at once, a per-request header
in the system prompt's first line, a tool added to the tool list) reuse the same share of
tokens whether the history fills a quarter of the context or nearly all of it. Where the plan
cannot work (cells another open session holds, no room for the history's growth, no flash
attention), it is refused before anything is computed and the sync does exact mode's work,
counted by reason (diff_shift_fallbacks_*)."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig
from test_reuse import reference, text_tokens

N_CTX = 2048
FILLS = [0.25, 0.5, 0.75, 0.95]
FALLBACKS = ("diff_shift_fallbacks_unsupported", "diff_shift_fallbacks_shared", "diff_shift_fallbacks_room")


def tier2(model, n_seq_max=4, **config):
    return Context(model, n_ctx=N_CTX, n_batch=256, n_seq_max=n_seq_max, n_threads=2,
                   config=OptConfig(env={}, diff_reuse_shifted=True, **config))


def agent_prompt(model, n):
    """An agent's prompt of n tokens: a header line, a tool list, a workspace file, the conversation."""
    header, tools = text_tokens(model, 12, seed=21), text_tokens(model, 150, seed=22)
    workspace = text_tokens(model, 300, seed=23)
    return header + tools + workspace + text_tokens(model, n - 462, seed=24)


def replace(tokens, start, n_old, new):
    return tokens[:start] + new + tokens[start + n_old:]


EDITS = {
    # a workspace line rewritten longer, then one rewritten shorter: everything after shifts
    "line-longer": lambda m, a: replace(a, 250, 12, text_tokens(m, 19, seed=31)),
    "line-shorter": lambda m, a: replace(a, 250, 19, text_tokens(m, 9, seed=32)),
    # a workspace line shorter, one longer further on, an earlier answer re-rendered shorter
    "several": lambda m, a: replace(replace(replace(a, len(a) * 3 // 4, 30, text_tokens(m, 14, seed=33)),
                                            400, 8, text_tokens(m, 13, seed=34)),
                                    240, 12, text_tokens(m, 5, seed=35)),
    # the system prompt's first line is a per-request header of another length
    "header": lambda m, a: replace(a, 1, 11, text_tokens(m, 14, seed=36)),
    # a tool added to the tool list
    "tools": lambda m, a: replace(a, 100, 0, text_tokens(m, 40, seed=37)),
}


def kl_divergence(expected, got):
    p = np.exp(expected - expected.max())
    q = np.exp(got - got.max())
    p, q = p / p.sum(), q / q.sum()
    return float(np.sum(p * (np.log(p) - np.log(q))))


def assert_close(got, expected):
    """Approximate by design; measured on these edits at the default shares (0.1, 0.25 for the
    header): max error 0.07-0.33, KL 2e-5 to 8e-3 (0.05-0.31 and 5e-3 at 0.25 everywhere)."""
    assert np.abs(got - expected).max() < 0.5
    assert kl_divergence(expected, got) < 1e-2


def spent_on(session, tokens):
    """The counters of one sync."""
    before = session.stats
    session.sync(tokens)
    return session.stats - before


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def kv_layout(ctx, session):
    """The cell of every position of the session's history: aligned (cell = tile + position
    mod 64) and increasing, as exactness and the decode tiles need."""
    return [ctx._core._test_kv_cell(session._core.seq, p) for p in range(session.n_tokens)]


def assert_canonical_layout(ctx, session):
    cells = kv_layout(ctx, session)
    assert min(cells) >= 0, "a position without KV"
    assert all(c % 64 == p % 64 for p, c in enumerate(cells)), "cells not aligned to their positions"
    assert all(x < y for x, y in zip(cells, cells[1:])), "cells not in position order"


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("edit", EDITS)
def test_an_edit_reuses_shifted_spans_at_any_fill(tiny_model, fill, edit):
    """The reproduction of issue 23: at 75 % and 95 % the old move needed room for a second copy of
    the span, gave up and computed everything again, more than the prompt has."""
    a = agent_prompt(tiny_model, int(fill * N_CTX) - 40)
    b = EDITS[edit](tiny_model, a)
    keep = common_prefix(a, b)
    with tier2(tiny_model) as ctx:
        s = ctx.session()
        s.sync(a)
        spent = spent_on(s, b)
        # a share of each span is computed again (and the rest of the edit's block): three edits
        # in a quarter of the context leave short spans
        assert spent.diff_tokens_shifted > (0.15 if edit == "several" else 0.5) * (len(b) - keep)
        assert all(getattr(spent, f) == 0 for f in FALLBACKS)
        # nothing computed twice, nothing thrown away: what is not moved is computed, once
        assert spent.tokens_prefilled + spent.diff_tokens_shifted == len(b) - keep
        assert s.approx_from == keep
        assert s.invariant_violation is None
        assert_canonical_layout(ctx, s)
        assert ctx.kv_cells_used <= max(len(a), len(b)) + 64
        assert_close(s.logits(), reference(tiny_model, b)[0])
        tail = text_tokens(tiny_model, 30, seed=41)  # the session goes on
        s.append(tail)
        assert_close(s.logits(), reference(tiny_model, b + tail)[0])
        assert_canonical_layout(ctx, s)


def test_every_turn_of_a_growing_trace_computes_at_most_what_exact_mode_does(tiny_model):
    """An agent trace that ends at 97 % of the context, its workspace line edited every third turn,
    beside exact mode: Tier 2 never computes more than exact mode on a turn, never falls back,
    and over the trace computes a fraction of it."""
    base = agent_prompt(tiny_model, 520)
    exact_total = tier2_total = 0
    with tier2(tiny_model) as approximate_ctx, Context(tiny_model, n_ctx=N_CTX, n_batch=256, n_seq_max=4, n_threads=2,
                                                        config=OptConfig(env={})) as exact_ctx:
        approximate, exact = approximate_ctx.session(), exact_ctx.session()
        history = base
        for turn in range(16):
            if turn % 3 == 2:  # the workspace line changes length: everything after it shifts
                history = replace(history, 250, 12 + turn % 2, text_tokens(tiny_model, 10 + 3 * (turn % 4), seed=turn))
            history = history + text_tokens(tiny_model, 90, seed=100 + turn)
            costs = [spent_on(s, history).tokens_prefilled for s in (exact, approximate)]
            assert costs[1] <= costs[0], f"turn {turn}"
            exact_total += costs[0]
            tier2_total += costs[1]
            assert_close(approximate.logits(), exact.logits())
        assert len(history) > 0.95 * N_CTX
        assert all(getattr(approximate.stats, f) == 0 for f in FALLBACKS)
        assert_canonical_layout(approximate_ctx, approximate)
    print(f"tokens computed: exact {exact_total}, Tier 2 {tier2_total}")
    assert tier2_total < 0.5 * exact_total


def test_cells_an_open_session_shares_past_the_edit_refuse_the_plan_before_computing(tiny_model):
    """A fork holds the blocks after the edit too: moving rows there would change its KV. The plan
    is refused (counted), and the sync does exactly what exact mode does."""
    a = agent_prompt(tiny_model, 1200)
    b = EDITS["line-longer"](tiny_model, a)
    expected_logits, expected_tokens = reference(tiny_model, b, 6)
    roomy = {"n_ctx": 4096, "n_batch": 256, "n_seq_max": 4, "n_threads": 2}  # exact mode's work fits beside the fork
    with Context(tiny_model, **roomy, config=OptConfig(env={}, diff_reuse_shifted=True)) as ctx:
        s = ctx.session()
        s.sync(a)
        twin = s.fork()
        spent = spent_on(s, b)
        assert spent.diff_shift_fallbacks_shared == 1 and spent.diff_tokens_shifted == 0
        assert s.approx_from is None  # computed exactly
        np.testing.assert_array_equal(s.logits(), expected_logits)
        assert [t.id for t in s.generate(6)] == expected_tokens
        np.testing.assert_array_equal(twin.logits(), reference(tiny_model, a)[0])
    with Context(tiny_model, **roomy, config=OptConfig(env={})) as ctx:
        s = ctx.session()
        s.sync(a)
        twin = s.fork()
        assert spent_on(s, b).tokens_prefilled == spent.tokens_prefilled


def test_cached_sequences_sharing_cells_past_the_edit_are_evicted_for_the_move(tiny_model):
    """A closed session's cached blocks are the cells a new session took its prefix from; an edit
    in that prefix evicts them (as the cache does for room), and the move goes ahead."""
    a = agent_prompt(tiny_model, 1200)
    b = EDITS["line-longer"](tiny_model, a)
    with tier2(tiny_model) as ctx:
        first = ctx.session()
        first.sync(a)
        first.close()
        assert ctx.n_cached == 1
        s = ctx.session()
        s.sync(a)
        assert s.stats.dedup_tokens_saved > 0  # shares the closed session's cells
        spent = spent_on(s, b)
        assert ctx.n_cached == 0 and ctx.stats.dedup_sequences_evicted == 1
        assert spent.diff_tokens_shifted > 0 and all(getattr(spent, f) == 0 for f in FALLBACKS)
        assert spent.tokens_prefilled + spent.diff_tokens_shifted == len(b) - common_prefix(a, b)
        assert_canonical_layout(ctx, s)


def test_no_room_for_the_growth_refuses_the_plan_and_does_exact_modes_work(tiny_model):
    """The session's cells reach the top of the cache, above a closed session's cached blocks, and
    its history grows by two blocks: there is no room above its cells, and evicting the cached
    blocks below makes none. Refused before anything is computed (counted); exact mode's work
    follows (it recomputes from the bottom of the cache), the very same as without Tier 2."""
    below = text_tokens(tiny_model, 1024, seed=51)
    a = agent_prompt(tiny_model, 1020)
    b = replace(a, 250, 0, text_tokens(tiny_model, 70, seed=52))
    expected = reference(tiny_model, b)[0]
    counts = []
    for config in ({"diff_reuse_shifted": True}, {}):
        with Context(tiny_model, n_ctx=N_CTX, n_batch=256, n_seq_max=4, n_threads=2,
                     config=OptConfig(env={}, **config)) as ctx:
            closed = ctx.session()
            closed.sync(below)
            closed.close()
            s = ctx.session()
            s.sync(a)
            assert ctx.n_cached == 1 and ctx.kv_cells_used > N_CTX - 64  # full: the cached blocks below, s above
            spent = spent_on(s, b)
            counts.append(spent.tokens_prefilled)
            assert ctx.n_cached == 0
            np.testing.assert_array_equal(s.logits(), expected)
            assert s.approx_from is None
            if config:
                assert spent.diff_shift_fallbacks_room == 1 and spent.diff_tokens_shifted == 0
    assert counts[0] == counts[1] == len(b)


def test_without_flash_attention_the_plan_is_refused_and_counted(tiny_model):
    a = agent_prompt(tiny_model, 700)
    b = EDITS["header"](tiny_model, a)
    with Context(tiny_model, n_ctx=N_CTX, n_batch=256, n_seq_max=4, n_threads=2, flash_attn=False,
                 config=OptConfig(env={}, diff_reuse_shifted=True)) as ctx:
        s = ctx.session()
        s.sync(a)
        spent = spent_on(s, b)
        assert spent.diff_shift_fallbacks_unsupported == 1 and spent.diff_tokens_shifted == 0
        assert s.approx_from is None
