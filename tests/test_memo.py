"""memo (output that repeats earlier output) on the tiny model: a draft of what followed the
history's end earlier is checked in one batch whose rows compute like one-token decode steps
(patches/0006), and sampling keeps the drafted tokens it picks anyway. Tier 1: the tokens and
the logits of every step are those of plain decoding, bit for bit; the cells of a draft that
sampling did not confirm are freed."""
from __future__ import annotations

import numpy as np
import pytest

from test_reuse import context, ids, text_tokens

N_GEN = 48


def repetitive_prompt(model):
    """A passage, then its beginning again: continuing it repeats earlier tokens."""
    passage = text_tokens(model, 120, seed=3)
    return passage + passage[:40]


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


def test_history_goes_on_exactly_after_a_checked_draft(tiny_model):
    """Appending, forking and syncing right after a generation (its draft's cells partly
    unconfirmed) continue as without memo."""
    prompt = repetitive_prompt(tiny_model)
    more = text_tokens(tiny_model, 30, seed=9)
    results = []
    for memo in (False, True):
        with context(tiny_model, memo_enabled=memo) as ctx:
            s = ctx.session()
            s.append(prompt)
            answer = ids(s.generate(20))
            fork = s.fork()
            s.append(more)
            after_append = s.logits()
            fork.sync(prompt + answer + more[:10])
            results.append((answer, after_append, fork.logits(), ids(s.generate(10))))
    (a0, l0, f0, g0), (a1, l1, f1, g1) = results
    assert a0 == a1 and g0 == g1
    np.testing.assert_array_equal(l0, l1)
    np.testing.assert_array_equal(f0, f1)


def test_draft_length_is_validated():
    from pyllamaopt import OptConfig, ConfigError

    assert OptConfig(env={}, memo_draft_max=15).memo_draft_max == 15
    with pytest.raises(ConfigError, match="memo_draft_max"):
        OptConfig(env={}, memo_draft_max=16)  # a check is one batch of at most 16 rows
