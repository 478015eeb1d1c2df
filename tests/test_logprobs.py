"""Log-probabilities in the library (pyllamaopt.logprobs, cpp/session/logprobs) on the tiny models:
a generated token's is the log-softmax of the raw logits it was picked from (not of the biased
ones), asking for them changes no token (a grammar's forced tokens included); Session.score gives
a prompt's own, bitwise a fresh context's whether the prefix was cached or not, and leaves the
session generating what a plain prompt generates; bad values are refused."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import InvalidArgumentError, InvalidTokenError
from test_reuse import context, text_tokens
from test_structured import FORCING, word_ids, words_model  # noqa: F401 (a fixture)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def test_a_tokens_logprob_is_the_log_softmax_of_the_raw_logits_it_was_picked_from(tiny_model):
    prompt = text_tokens(tiny_model, 40)
    with context(tiny_model, memo_enabled=False) as ctx:
        s = ctx.session()
        s.append(prompt)
        seen = [s.logits()]
        got = []
        for token in s.generate(12, logprobs=3, logit_bias={7: 5.0}, temperature=0.8, seed=3):
            got.append(token)
            seen.append(s.logits())
    for token, logits in zip(got, seen, strict=False):
        expected = log_softmax(logits)
        assert token.logprob is not None and token.logprob.token == token.id
        assert token.logprob.logprob == pytest.approx(expected[token.id], abs=1e-5)  # the raw logits: no bias
        best = np.argsort(-expected, kind="stable")[:3]
        assert [t for t, _ in token.logprob.top] == [int(b) for b in best]
        assert [v for _, v in token.logprob.top] == pytest.approx([expected[b] for b in best], abs=1e-5)


def test_asking_for_logprobs_changes_no_token(tiny_model):
    prompt = text_tokens(tiny_model, 300, seed=1)
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(prompt)
        plain = [t.id for t in s.generate(30)]
        s.sync(prompt)
        with_logprobs = list(s.generate(30, logprobs=0))
    assert [t.id for t in with_logprobs] == plain
    assert all(t.logprob is not None and t.logprob.top == () for t in with_logprobs)


def test_forced_tokens_are_picked_from_logits_with_logprobs_and_stay_the_same(words_model):  # noqa: F811
    prompt = word_ids(words_model, "hello world")
    with context(words_model) as ctx:
        s = ctx.session()
        s.append(prompt)
        before = s.stats
        skipped = s.generate(40, grammar=FORCING)
        skipped_tokens = [t.id for t in skipped]
        assert (s.stats - before).schema_tokens_inferred > 0  # (the grammar forced tokens)
        s.sync(prompt)
        before = s.stats
        scored = list(s.generate(40, grammar=FORCING, logprobs=2))
        assert (s.stats - before).schema_tokens_inferred == 0
    assert [t.id for t in scored] == skipped_tokens
    assert all(t.logprob is not None and t.logprob.logprob <= 0 for t in scored)


def test_score_is_a_fresh_contexts_bitwise_cold_or_warm(tiny_model):
    tokens = text_tokens(tiny_model, 700, seed=2)
    with context(tiny_model) as ctx:
        cold = ctx.session().score(tokens, top_logprobs=4)
    assert cold[0] is None and len(cold) == len(tokens)
    assert all(lp is not None and lp.token == t for lp, t in zip(cold[1:], tokens[1:], strict=True))
    with context(tiny_model) as ctx:
        warm = ctx.session()
        warm.append(tokens[:600])  # the prefix cached, in this session and in the pool
        before = warm.stats
        assert warm.score(tokens, top_logprobs=4) == cold
        assert (warm.stats - before).tokens_prefilled == len(tokens)  # every position computed again
        other = ctx.session()
        other.append(tokens[:300])
        assert other.score(tokens, top_logprobs=4) == cold


def test_after_score_a_session_generates_what_a_plain_prompt_generates(tiny_model):
    tokens = text_tokens(tiny_model, 333, seed=4)
    with context(tiny_model) as ctx:
        plain = ctx.session()
        plain.append(tokens)
        logits = plain.logits()
        answer = [t.id for t in plain.generate(20)]
        scored = ctx.session()
        scored.score(tokens)
        assert scored.tokens == tokens and scored.invariant_violation is None
        assert np.array_equal(scored.logits(), logits)
        assert [t.id for t in scored.generate(20)] == answer


@pytest.mark.parametrize("call, message", [
    (lambda s: s.generate(4, logprobs=21), "logprobs must be an integer between 0 and 20"),
    (lambda s: s.generate(4, logprobs=-1), "logprobs must be an integer between 0 and 20"),
    (lambda s: s.generate(4, logprobs=True), "logprobs must be an integer between 0 and 20"),
    (lambda s: s.score([1, 2], top_logprobs=21), "top_logprobs must be an integer between 0 and 20"),
    (lambda s: s.score([]), "score needs at least one token"),
    (lambda s: s.score([1, 10**9]), "outside the vocabulary"),
])
def test_bad_values_are_refused(tiny_context, call, message):
    s = tiny_context.session()
    s.append([1, 2, 3])
    with pytest.raises((InvalidArgumentError, InvalidTokenError), match=message):
        call(s)
    assert s.tokens == [1, 2, 3]
