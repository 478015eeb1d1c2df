"""Tier 2 reuse of generated tokens' KV (diff_reuse_generated) on the tiny model. Exact mode
computes the tokens a session generated again when the history grows (their one-token steps
compute rows that differ in the last bits from the prefill the baseline does); with this option
their KV stays, as llama.cpp's own prefix reuse keeps it. Approximate by design: its quality on
a real model is measured by benchmarks/agent_trace.py. Tested here: the work it saves, that it
is close to the exact result, and that it never leaks into what is promised exact."""
from __future__ import annotations

import numpy as np

from test_reuse import context, ids, reference, text_tokens

PROMPT_LEN, N_GEN = 300, 20


def turn_after_generating(model, **config):
    """A prompt, a generated answer, then the history re-sent with a new message after the
    answer: returns (session stats of the re-send, its logits, approx_from, full history)."""
    prompt = text_tokens(model, PROMPT_LEN)
    message = text_tokens(model, 40, seed=5)
    with context(model, **config) as ctx:
        s = ctx.session()
        s.append(prompt)
        answer = ids(s.generate(N_GEN))
        history = prompt + answer + message
        before = s.stats
        s.sync(history)
        return s.stats - before, s.logits(), s.approx_from, history


def test_generated_tokens_are_kept_instead_of_computed_again(tiny_model):
    # memo off: a checked draft may already have computed the answer's last token
    spent, logits, approx_from, history = turn_after_generating(tiny_model, diff_reuse_generated=True,
                                                                memo_enabled=False)
    # the answer's last token (sampled, never decoded) and the message: nothing else
    assert spent.tokens_prefilled == 1 + 40
    assert approx_from == PROMPT_LEN  # the prompt's rows are canonical, the answer's are not
    expected = reference(tiny_model, history)[0]
    assert logits.argmax() == expected.argmax()
    assert 0 < np.abs(logits - expected).max() < 0.05  # the one-token steps' rows differ in the last bits


def test_exact_mode_computes_the_answer_again_and_matches_the_baseline(tiny_model):
    spent, logits, approx_from, history = turn_after_generating(tiny_model)
    assert spent.tokens_prefilled >= N_GEN + 40
    assert approx_from is None
    np.testing.assert_array_equal(logits, reference(tiny_model, history)[0])


def test_kept_generated_kv_is_never_shared(tiny_model):
    prompt = text_tokens(tiny_model, PROMPT_LEN)
    with context(tiny_model, diff_reuse_generated=True) as ctx:
        s = ctx.session()
        s.append(prompt)
        history = prompt + ids(s.generate(N_GEN)) + text_tokens(tiny_model, 40, seed=5)
        s.sync(history)
        assert s.approx_from == PROMPT_LEN
        expected_logits, expected_tokens = reference(tiny_model, history, 8)
        fresh = ctx.session()
        fresh.append(history)  # may share the prompt's exact blocks, nothing after them
        assert fresh.stats.dedup_tokens_saved <= PROMPT_LEN
        np.testing.assert_array_equal(fresh.logits(), expected_logits)
        twin = s.fork()
        assert twin.approx_from is None
        np.testing.assert_array_equal(twin.logits(), expected_logits)
        assert ids(twin.generate(8)) == expected_tokens
