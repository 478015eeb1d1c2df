"""memo (output that repeats earlier output) on the tiny model: a draft of what followed the
history's end earlier is checked in one batch whose rows compute like one-token decode steps
(patches/0006), and sampling keeps the drafted tokens it picks anyway. Tier 1: the tokens and
the logits of every step are those of plain decoding, bit for bit; the cells of a draft that
sampling did not confirm are freed."""
from __future__ import annotations

import numpy as np
import pytest

from test_reuse import context as reuse_context
from test_reuse import ids, text_tokens

N_GEN = 48


def repetitive_prompt(model):
    """A passage, then its beginning again: continuing it repeats earlier tokens."""
    passage = text_tokens(model, 120, seed=3)
    return passage + passage[:40]


def context(model, **config):
    """A context whose memo checks every draft it finds: these tests count what the drafting
    itself does (the gate, on by default, follows timings: docs/memo.md)."""
    return reuse_context(model, **{"memo_gate": False, **config})


def generate_with_logits(model, prompt, n=N_GEN, sampling=None, **config):
    """Tokens generated and the logits seen before each of them; plus the session's stats and
    the cells the context uses once the turn is over."""
    with context(model, **config) as ctx:
        s = ctx.session()
        s.append(prompt)
        tokens, logits = [], []
        for token in s.generate(n, **(sampling or {})):
            tokens.append(token.id)
            logits.append(s.logits())
        return tokens, logits, s.stats, ctx.kv_cells_used


@pytest.mark.parametrize("sampling", [None, {"temperature": 0.1, "seed": 11, "top_k": 0, "top_p": 1.0, "min_p": 0.0}])
def test_memo_changes_neither_tokens_nor_logits(tiny_model, sampling):
    prompt = repetitive_prompt(tiny_model)
    off = generate_with_logits(tiny_model, prompt, sampling=sampling, memo_enabled=False)
    on = generate_with_logits(tiny_model, prompt, sampling=sampling, memo_enabled=True)
    assert on[0] == off[0]
    for a, b in zip(on[1], off[1]):
        np.testing.assert_array_equal(a, b)
    assert on[2].memo_tokens_skipped > 0  # the draft was used, not just computed
    assert on[2].forward_passes < off[2].forward_passes
    assert on[3] == off[3]  # a draft's unconfirmed cells are freed when the turn ends


def test_counters(tiny_model):
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(repetitive_prompt(tiny_model))
        before = s.stats
        tokens = ids(s.generate(N_GEN))
        spent = s.stats - before
    assert 0 < spent.memo_tokens_skipped and 0 < spent.memo_hits <= spent.memo_lookups
    # each token after the first needs the one before it computed: by a forward pass (a plain
    # step or a draft's check) or as a confirmed drafted token
    assert spent.forward_passes + spent.memo_tokens_skipped == len(tokens) - 1
    assert spent.forward_passes == spent.memo_lookups  # every step looked for a draft


def test_memo_off_by_config_does_nothing(tiny_model):
    _, _, stats, _ = generate_with_logits(tiny_model, repetitive_prompt(tiny_model), memo_enabled=False)
    assert (stats.memo_lookups, stats.memo_hits, stats.memo_tokens_skipped) == (0, 0, 0)


@pytest.mark.parametrize("live_draft", [False, True])
def test_history_goes_on_exactly_after_a_checked_draft(tiny_model, live_draft):
    """Forking, appending and syncing right after generating continue as without memo: after the
    turn, and in the middle of one (a checked draft's cells still beyond the history)."""
    prompt = repetitive_prompt(tiny_model)
    more = text_tokens(tiny_model, 30, seed=9)
    results = []
    n_taken = None  # the memo run stops right after a drafted token was confirmed; off takes as many
    for memo in (True, False):
        with context(tiny_model, memo_enabled=memo) as ctx:
            s = ctx.session()
            s.append(prompt)
            generation = s.generate(N_GEN)
            answer = []
            while len(answer) < (n_taken or N_GEN) and not (memo and s.stats.memo_tokens_skipped):
                answer.append(next(generation).id)
            n_taken = len(answer)
            if not live_draft:
                generation.close()  # ends the turn
            peek = s.logits()
            fork = s.fork()
            s.append(more)
            after_append = s.logits()
            fork.sync(prompt + answer + more[:10])
            results.append((answer, peek, after_append, fork.logits(), ids(s.generate(10)), s.stats, ctx.kv_cells_used))
            generation.close()
    on, off = results
    assert on[0] == off[0] and on[4] == off[4]
    for a, b in zip(on[1:4], off[1:4]):
        np.testing.assert_array_equal(a, b)
    assert on[5].memo_tokens_skipped > 0
    assert on[6] == off[6]


def asked_again(ctx, prompt):
    """A session's answer to the prompt (N_GEN tokens), and a second session given the same prompt."""
    first = ctx.session()
    first.append(prompt)
    answer = ids(first.generate(N_GEN))
    second = ctx.session()
    second.append(prompt)
    return answer, second


@pytest.mark.parametrize("prompt_seed", [5, 6])
def test_drafts_from_another_sessions_output(tiny_model, prompt_seed):
    """memo_shared: a session of the context asked what another one answered before (a request
    sent again, another agent given the same task) takes drafts from that answer, which its own
    history does not hold. Tokens and every step's logits stay those of plain decoding."""
    prompt = text_tokens(tiny_model, 120, seed=prompt_seed)
    runs = {}
    for name, config in {"off": {"memo_enabled": False}, "own": {"memo_shared": False}, "shared": {}}.items():
        with context(tiny_model, **config) as ctx:
            answer, second = asked_again(ctx, prompt)
            before = second.stats
            tokens, logits = [], []
            for token in second.generate(N_GEN):
                tokens.append(token.id)
                logits.append(second.logits())
            runs[name] = (answer, tokens, logits, second.stats - before, ctx.kv_cells_used)
    off, own, shared = runs["off"], runs["own"], runs["shared"]
    assert off[1] == off[0] == shared[0] == shared[1] == own[1]
    for a, b in zip(shared[2], off[2]):
        np.testing.assert_array_equal(a, b)
    assert own[3].memo_shared_hits == own[3].memo_shared_tokens_skipped == 0
    assert shared[3].memo_shared_tokens_skipped > len(shared[1]) // 2  # most of the answer came drafted
    assert 0 < shared[3].memo_shared_hits <= shared[3].memo_hits
    assert shared[3].memo_shared_tokens_skipped <= shared[3].memo_tokens_skipped
    assert shared[3].forward_passes < own[3].forward_passes
    assert shared[4] == off[4]  # no draft's cells left behind


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 9])
def test_drafts_stop_at_the_outputs_last_token(tiny_model, max_tokens):
    """Row j of a draft's check gives the logits of the output's token j + 1 after the pending one:
    rows past max_tokens would be computed for no one. A second session asked what the first
    answered confirms every drafted token (memo_shared), so with drafts cut at the budget the turn
    computes each position of its output once, the last token left pending as in plain decoding:
    max_tokens - 1 rows (without the cut, the last check drafted memo_draft_max tokens)."""
    prompt = text_tokens(tiny_model, 120, seed=5)
    with context(tiny_model) as ctx:
        answer, second = asked_again(ctx, prompt)
        before = second.stats
        tokens = ids(second.generate(max_tokens))
        spent = second.stats - before
    assert tokens == answer[:max_tokens]
    assert spent.memo_tokens_skipped == max(0, max_tokens - 2)  # all but the first (prompt) and last (last row)
    assert spent.tokens_decoded == max_tokens - 1


def test_draft_length_is_validated():
    from pyllamaopt import OptConfig, ConfigError

    assert OptConfig(env={}, memo_draft_max=8).memo_draft_max == 8
    with pytest.raises(ConfigError, match="memo_draft_max"):
        OptConfig(env={}, memo_draft_max=9)  # drafts are at most as long as the 8-token match


def test_memo_draft_cost_replays_the_draft_search():
    """_core.memo_draft_cost (benchmarks/overhead.py): the search before each step, at every
    history length from `start` on — a draft wherever the suffix occurred before."""
    from pyllamaopt import _core

    history = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]
    drafts, ns = _core.memo_draft_cost(history, 6)
    # lengths 6..10 end in 6 | 1 | 1 2 | 1 2 3 | 1 2 3 4: a suffix of 2+ tokens seen before from length 8 on
    assert drafts == 3 and ns > 0
    assert _core.memo_draft_cost(list(range(20)), 0)[0] == 0  # nothing repeats
