"""Tier 2, speculative prefill (specification 001, spec_prefill_enabled; off by default): a scorer
(the model's own first layers, or a draft model with the same vocabulary) scores a prompt, and the
model computes only the tokens kept, at their own positions.

Tested here: the host-side scoring against a NumPy reference on random inputs, and the mechanics
(what is kept and dropped, the counters, the approximate flag, generation and later turns on the
session, exactness at keep 1.0, errors). Quality is measured by benchmarks/quality.py, not asserted."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pyllamaopt import ConfigError, Context, InvalidArgumentError, ModelLoadError, OptConfig, _core
from test_reuse import reference, text_tokens
from tinymodel import write_tiny_llama


def context(model, **config):
    return Context(model, n_ctx=4096, n_batch=256, n_seq_max=8, n_threads=2, config=OptConfig(env={}, **config))


def spec_context(model, **config):
    return context(model, spec_prefill_enabled=True, spec_prefill_min_tokens=100, **config)


# ---------------------------------------------------------------------------------------------
# the host-side scoring (methods/attn-score)


def numpy_importance(q, k, n_head, n_head_kv, head_dim, scale, last_layers=0, pool=1, window=1):
    """001 in NumPy: per layer, each of the last `window` tokens' softmax per head over the keys up to
    its own position (query head h reads KV head h // (n_head / n_head_kv)), max over heads, mean over
    those queries; mean over the selected layers; average pooling."""
    n_layers = len(q)
    used = range(n_layers) if last_layers == 0 else range(n_layers - min(last_layers, n_layers), n_layers)
    group = n_head // n_head_kv
    total = 0.0
    for layer in used:
        keys = np.asarray(k[layer], np.float64).reshape(-1, n_head_kv, head_dim)
        n_keys = len(keys)
        window_queries = np.asarray(q[layer], np.float64).reshape(-1, n_head, head_dim)
        per_query = []
        for t, queries in enumerate(window_queries):
            seen = n_keys - len(window_queries) + t + 1  # causal: keys up to the query's own position
            heads = []
            for h in range(n_head):
                z = keys[:seen, h // group, :] @ queries[h] * scale
                z = np.exp(z - z.max())
                heads.append(np.concatenate([z / z.sum(), np.zeros(n_keys - seen)]))
            per_query.append(np.max(heads, axis=0))
        total = total + np.mean(per_query, axis=0)
    importance = total / len(used)
    half = pool // 2
    if pool > 1:
        importance = np.array([importance[max(0, i - half):i + half + 1].mean() for i in range(len(importance))])
    return importance


def numpy_keep(importance, keep, window=1):
    n = len(importance)
    keep = float(np.float32(keep))  # the engine's keep fraction is a float
    k = min(n, max(1, math.ceil(keep * n * (1 - 1e-6))))
    forced = min(k, window)  # the window's tokens, always
    best = np.argsort(-np.asarray(importance[:n - forced]), kind="stable")[:k - forced]
    return sorted([int(i) for i in best] + list(range(n - forced, n)))


def test_scoring_of_the_specification_example():
    k = [[1, 0, 1, 2, 0, 1, 0, 2, 1, 1, 2, 2]]  # [s][g][d]
    q = [[1, 0, 0, 1, 1, 1, 2, 1]]              # [h][d]
    importance = _core.spec_prefill_importance(q, k, 4, 2, 2, 1 / math.sqrt(2))
    assert importance == pytest.approx([0.401, 0.401, 0.768], abs=1e-3)
    assert _core.spec_prefill_keep(importance, 0.5) == [0, 2]


@pytest.mark.parametrize("seed", range(12))
def test_scoring_equals_a_numpy_reference_on_random_inputs(seed):
    rng = np.random.default_rng(seed)
    n_head_kv = int(rng.choice([1, 2, 4]))
    n_head = n_head_kv * int(rng.choice([1, 2, 4]))
    head_dim, n_keys, n_layers = int(rng.choice([2, 8, 16, 33])), int(rng.integers(1, 300)), int(rng.integers(1, 6))
    scale = 1 / math.sqrt(head_dim)
    window = (1, 3, 32)[seed % 3]
    n_query = min(window, n_keys)
    q = [list(rng.normal(0, 2, n_query * n_head * head_dim).astype(np.float32)) for _ in range(n_layers)]
    k = [list(rng.normal(0, 2, n_keys * n_head_kv * head_dim).astype(np.float32)) for _ in range(n_layers)]
    for last_layers in (0, 1, 4):
        for pool in (1, 4, 13):
            got = _core.spec_prefill_importance(q, k, n_head, n_head_kv, head_dim, scale, last_layers, pool, window)
            np.testing.assert_allclose(
                got, numpy_importance(q, k, n_head, n_head_kv, head_dim, scale, last_layers, pool, n_query),
                atol=1e-5, rtol=1e-5)
            for keep in (0.0, 0.1, 0.3, 0.5, 1.0, float(rng.random())):
                assert _core.spec_prefill_keep(got, keep, window) == numpy_keep(got, keep, window)


def test_scoring_refuses_inconsistent_shapes():
    with pytest.raises(InvalidArgumentError):
        _core.spec_prefill_importance([[1.0] * 8], [[1.0] * 12, [1.0] * 12], 4, 2, 2, 0.5)
    with pytest.raises(InvalidArgumentError):
        _core.spec_prefill_importance([[1.0] * 7], [[1.0] * 12], 4, 2, 2, 0.5)
    with pytest.raises(InvalidArgumentError):
        _core.spec_prefill_importance([[1.0] * 8], [[1.0] * 12], 4, 3, 2, 0.5)


# ---------------------------------------------------------------------------------------------
# the engine


def hole_positions(session):
    return {p for a, b in session.holes for p in range(a, b)}


def test_off_by_default(tiny_model):
    assert OptConfig(env={}).spec_prefill_enabled is False
    tokens = text_tokens(tiny_model, 1200)
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.stats.spec_prefill_tokens_scored == 0 and s.holes == [] and s.approx_from is None
        assert s.stats.tokens_prefilled == 1200


def test_the_model_computes_only_the_kept_tokens(tiny_model):
    tokens = text_tokens(tiny_model, 700)
    with spec_context(tiny_model, spec_prefill_keep=0.3, spec_prefill_layers=1) as ctx:
        s = ctx.session()
        s.append(tokens)
        stats = s.stats
        kept = math.ceil(0.3 * 700)
        assert stats.spec_prefill_prompts == 1 and stats.spec_prefill_tokens_scored == 700
        assert stats.spec_prefill_tokens_kept == kept and stats.spec_prefill_tokens_dropped == 700 - kept
        assert stats.tokens_prefilled == kept  # only what the model computed
        assert stats.spec_prefill_score_us > 0
        dropped = hole_positions(s)
        assert len(dropped) == 700 - kept and 699 not in dropped
        assert s.approx_from == min(dropped) and s.n_tokens == 700
        assert ctx.kv_cells_used == kept  # the scorer's cells are gone
        assert s.invariant_violation is None
        assert not np.array_equal(s.logits(), reference(tiny_model, tokens)[0])
        # generation and a later turn work as usual; a short turn is computed whole
        generated = [t.id for t in s.generate(6)]
        assert len(generated) == 6
        s.append(text_tokens(tiny_model, 30, seed=5))
        assert hole_positions(s) == dropped and s.stats.spec_prefill_prompts == 1
        assert s.invariant_violation is None
        # a long turn is scored on top of the session's KV (holes and all)
        before = s.n_tokens
        s.append(text_tokens(tiny_model, 400, seed=6))
        assert s.stats.spec_prefill_prompts == 2 and s.stats.spec_prefill_tokens_scored == 1100
        new_holes = hole_positions(s) - dropped
        assert len(new_holes) == 400 - math.ceil(0.3 * 400) and min(new_holes) >= before
        assert s.n_tokens - 1 not in new_holes and s.invariant_violation is None
        # nothing approximate leaves the session: a fork computes what is past the exact prefix
        # (exactly once speculative prefill is off for it; with it on, it would score its own prompt)
        f = s.fork()
        assert f.approx_from is None and f.holes == []
        f.configure_tier2(spec_prefill_enabled=False)
        assert np.array_equal(f.logits(), reference(tiny_model, f.tokens)[0])


@pytest.mark.parametrize("window", [1, 8])
def test_the_kept_tokens_are_the_ones_the_last_queries_attend_to_most(tiny_model, window):
    """Scorer = both layers of the tiny model: the kept tokens are 001's top-k of the scores
    computed in NumPy from an exact prefill's own queries (the last `window` tokens') and keys
    (attention_probe), and the window's tokens."""
    tokens = text_tokens(tiny_model, 500, seed=2)
    with context(tiny_model, attn_prune_enabled=True, attn_prune_threshold=0.0, attn_prune_queries=window) as ctx:
        probe = ctx.session()
        probe.append(tokens)
        p = probe.attention_probe()
        probe.discard()
        q = [p["q"][layer, -window:].ravel() for layer in range(2)]
        k = [p["k"][layer].ravel() for layer in range(2)]
        expected = numpy_importance(q, k, p["n_head"], p["n_head_kv"], p["q"].shape[-1], p["scale"], window=window)
        s = ctx.session()
        s.configure_tier2(spec_prefill_enabled=True, spec_prefill_min_tokens=100, spec_prefill_keep=0.2,
                          spec_prefill_layers=2, spec_prefill_last_layers=0, spec_prefill_pool=1,
                          spec_prefill_window=window)
        s.append(tokens)
        kept = sorted(set(range(500)) - hole_positions(s))
    # the token before the last is kept too (the next step decodes the last one after it)
    before_last = [498] if window == 1 and 498 not in numpy_keep(expected, 0.2, window) else []
    assert len(kept) == 100 + len(before_last) and kept[-window:] == list(range(500 - window, 500))
    # the keys the model attends with are F16 in the KV cache: near-ties may order differently
    ranked = [i for i in kept[:-window] if i not in before_last]
    threshold = np.sort(expected[:500 - window])[::-1][len(ranked) - 1]
    assert all(expected[i] >= threshold - 1e-3 for i in ranked)
    assert len(set(kept) & set(numpy_keep(expected, 0.2, window))) >= 95


@pytest.mark.parametrize("keep, window", [(0.3, 1), (0.0, 32)])
def test_a_session_generates_after_any_keep_and_window(tiny_model, keep, window):
    """The token before the last keeps its KV whatever the scorer picks: the first step decodes the
    last token right after it (with 001's window of 1, or keep 0, it was dropped and the session
    could not generate: a DecodeError, then an invariant violation)."""
    tokens = text_tokens(tiny_model, 600, seed=3)
    with spec_context(tiny_model, spec_prefill_keep=keep, spec_prefill_window=window) as ctx:
        s = ctx.session()
        s.append(tokens)
        dropped = hole_positions(s)
        assert 598 not in dropped and 599 not in dropped and len(dropped) > 300
        assert len(list(s.generate(4))) == 4 and s.invariant_violation is None
        s.append(text_tokens(tiny_model, 20, seed=4))
        assert len(list(s.generate(2))) == 2 and s.invariant_violation is None


def test_keep_one_is_exact_prefill(tiny_model):
    tokens = text_tokens(tiny_model, 700)
    expected_logits, expected_tokens = reference(tiny_model, tokens, 8)
    with spec_context(tiny_model, spec_prefill_keep=1.0) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.stats.spec_prefill_tokens_scored == 700 and s.stats.spec_prefill_tokens_kept == 700
        assert s.stats.spec_prefill_tokens_dropped == 0 and s.stats.tokens_prefilled == 700
        assert s.holes == [] and s.approx_from is None
        assert np.array_equal(s.logits(), expected_logits)
        assert [t.id for t in s.generate(8)] == expected_tokens


def test_short_prompts_are_computed_whole(tiny_model):
    tokens = text_tokens(tiny_model, 99)
    with spec_context(tiny_model, spec_prefill_keep=0.1) as ctx:
        s = ctx.session()
        s.append(tokens)
        assert s.stats.spec_prefill_tokens_scored == 0 and s.holes == []
        assert np.array_equal(s.logits(), reference(tiny_model, tokens)[0])


def test_a_draft_model_scores_the_prompt(tiny_model, tmp_path):
    draft = write_tiny_llama(tmp_path / "draft.gguf", seed=7, n_layer=1, n_embd=32, n_head=2, n_head_kv=1)
    tokens = text_tokens(tiny_model, 600)
    with context(tiny_model, spec_prefill_enabled=True, spec_prefill_min_tokens=100, spec_prefill_keep=0.25,
                 spec_prefill_draft_model=str(draft)) as ctx:
        s = ctx.session()
        s.append(tokens)
        kept = math.ceil(0.25 * 600)
        assert s.stats.spec_prefill_tokens_scored == 600 and s.stats.spec_prefill_tokens_kept == kept
        assert s.stats.tokens_prefilled == kept and len(hole_positions(s)) == 600 - kept
        assert ctx.kv_cells_used == kept and s.invariant_violation is None
        s.append(text_tokens(tiny_model, 200, seed=4))  # the draft scores the whole history again
        assert s.stats.spec_prefill_tokens_scored == 600 + 800
        assert len(list(s.generate(4))) == 4
    with context(tiny_model, spec_prefill_enabled=True, spec_prefill_draft_model=str(draft)) as ctx:
        with pytest.raises(InvalidArgumentError):  # the model's own layers are not observed with a draft
            ctx.session().attention_probe()


def test_a_draft_with_another_vocabulary_or_no_file_is_refused(tiny_model, tmp_path):
    other = write_tiny_llama(tmp_path / "words.gguf", characters=False)
    with pytest.raises(InvalidArgumentError, match="vocabulary"):
        context(tiny_model, spec_prefill_enabled=True, spec_prefill_draft_model=str(other))
    with pytest.raises(ModelLoadError):
        context(tiny_model, spec_prefill_enabled=True, spec_prefill_draft_model=str(tmp_path / "missing.gguf"))


def test_settings_are_validated_and_need_the_context(tiny_model, monkeypatch):
    for bad in (dict(spec_prefill_keep=1.5), dict(spec_prefill_layers=0), dict(spec_prefill_pool=0),
                dict(spec_prefill_window=0), dict(spec_prefill_window=1025), dict(spec_prefill_min_tokens=1),
                dict(spec_prefill_keep="half")):
        with pytest.raises(ConfigError):
            OptConfig(env={}, **bad)
    monkeypatch.setenv("LLAMA_OPT_SPEC_PREFILL_KEEP", "abc")
    with pytest.raises(ConfigError, match="LLAMA_OPT_SPEC_PREFILL_KEEP"):
        OptConfig()
    monkeypatch.setenv("LLAMA_OPT_SPEC_PREFILL_KEEP", "0.2")
    assert OptConfig().spec_prefill_keep == pytest.approx(0.2)
    with context(tiny_model) as ctx:
        s = ctx.session()
        with pytest.raises(InvalidArgumentError, match="spec_prefill_enabled"):
            s.configure_tier2(spec_prefill_enabled=True)
        with pytest.raises(InvalidArgumentError):
            s.configure_tier2(spec_prefill_draft_model="x.gguf")
