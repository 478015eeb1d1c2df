"""Room in the KV cache for a prompt, found before anything is computed.

A session's new blocks must lie above its other cells (canonical placement: its cells stay in
position order). Before a prompt is computed the context checks that they fit there; if not, the
session computes its whole history again from the bottom of the cache, once there is room for all
of it (cached sequences, then idle sessions evicted, least recently used first). Nothing computed is
thrown away, and a prompt of several chunks gets an idle session evicted as a prompt of one does
(it did not: its first chunks were placed above the idle session's cells, and freeing those then
left no room for the next chunk above them)."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, ContextOverflowError, OptConfig
from test_reuse import reference, text_tokens


def small_context(model, n_ctx=1024, **config):
    return Context(model, n_ctx=n_ctx, n_batch=256, n_seq_max=8, n_threads=2, config=OptConfig(env={}, **config))


def spent_on_append(session, tokens):
    before = session.stats
    session.append(tokens)
    return session.stats - before


@pytest.mark.parametrize("n_tokens, evicts", [(700, False), (750, True)])
def test_a_prompt_of_several_chunks_gets_an_idle_session_evicted(tiny_model, n_tokens, evicts):
    """The lead's reproduction: 300 tokens of an idle session leave 11 of 16 tiles; 700 tokens fit
    in them, 750 need the idle session's room (three chunks of at most 256 tokens)."""
    prompt = text_tokens(tiny_model, n_tokens, seed=2)
    with small_context(tiny_model) as ctx:
        idle = ctx.session()
        idle.append(text_tokens(tiny_model, 300, seed=1))
        newest = ctx.session()
        spent = spent_on_append(newest, prompt)
        assert idle.evicted == evicts
        assert ctx.stats.sessions_evicted == int(evicts)
        assert spent.tokens_prefilled == n_tokens and spent.forward_passes == 3  # computed once
        np.testing.assert_array_equal(newest.logits(), reference(tiny_model, prompt)[0])


def test_a_session_moving_down_computes_its_history_once(tiny_model):
    """The session's cells end one tile short of the top after the session below it is closed: it
    cannot grow in place and computes its whole history again from the bottom (exactly as from
    scratch), without first computing the chunks that still fit above it."""
    history = text_tokens(tiny_model, 1400, seed=4)
    more = text_tokens(tiny_model, 600, seed=5)
    with small_context(tiny_model, n_ctx=2048, dedup_enabled=False) as ctx:
        below = ctx.session()
        below.append(text_tokens(tiny_model, 300, seed=3))
        s = ctx.session()
        s.append(history)
        below.close()  # its 5 tiles are free now, below s; 5 are free above s, which needs 10 more
        spent = spent_on_append(s, more)
        assert spent.tokens_prefilled == len(history + more)
        assert spent.forward_passes == 8  # 2000 tokens in chunks of 256: computed once
        assert ctx.stats.sessions_evicted == 0
        np.testing.assert_array_equal(s.logits(), reference(tiny_model, history + more)[0])
        assert s.invariant_violation is None


def test_a_cached_sequence_below_the_session_is_not_evicted_for_its_growth(tiny_model):
    """Only KV above the session's cells is in the way of its new blocks: a closed session's cached
    blocks below them stay, those above go."""
    with small_context(tiny_model, n_ctx=2048) as ctx:
        low = ctx.session()
        low.append(text_tokens(tiny_model, 256, seed=6))
        s = ctx.session()
        s.append(text_tokens(tiny_model, 640, seed=7))
        high = ctx.session()
        high.append(text_tokens(tiny_model, 1024, seed=8))
        low.close()
        high.close()
        assert ctx.n_cached == 2
        spent = spent_on_append(s, text_tokens(tiny_model, 300, seed=9))
        assert spent.tokens_prefilled < 400  # grew in place
        assert ctx.n_cached == 1 and ctx.stats.dedup_sequences_evicted == 1
        reused = ctx.session()
        reused.append(text_tokens(tiny_model, 256, seed=6) + [5])
        assert reused.stats.dedup_tokens_saved == 192  # `low` is the one kept (a last chunk holds >= 64)


def test_no_room_even_after_evicting_computes_nothing(tiny_model):
    """A session in the middle of a generation cannot be evicted: a prompt that needs its room
    fails before any of it is computed, and the generation goes on as it would have."""
    first = text_tokens(tiny_model, 600, seed=10)
    _, expected = reference(tiny_model, first, 8)
    with small_context(tiny_model) as ctx:
        busy = ctx.session()
        busy.append(first)
        generation = busy.generate(8)
        got = [next(generation).id]
        other = ctx.session()
        before = ctx.stats
        with pytest.raises(ContextOverflowError, match="KV cache is full"):
            other.append(text_tokens(tiny_model, 600, seed=11))
        spent = ctx.stats - before
        assert spent.tokens_prefilled == 0 and spent.forward_passes == 0
        assert other.n_tokens == 0 and not busy.evicted
        got += [t.id for t in generation]
        assert got == expected


def test_a_history_at_the_top_of_the_cache_finds_room_for_its_answer(tiny_model):
    """A prompt placed in the cache's top tiles (the free ones when it came) could not grow while
    generating although the tiles below were free (cached blocks of a closed session): its answer
    ended as 'context_full' after a few tokens (a server answered "length" at 19 of 60 tokens).
    Its room is found before the first token: the history computed again from the bottom, the
    answer the one a context of its own gives."""
    prompt = text_tokens(tiny_model, 64, seed=13)
    _, expected = reference(tiny_model, prompt, 100)
    with small_context(tiny_model, n_ctx=512) as ctx:
        below = ctx.session()
        below.append(text_tokens(tiny_model, 448, seed=12))  # tiles 0-6 of 8
        s = ctx.session()
        s.append(prompt)  # tile 7, the top
        below.close()  # cached blocks, evictable
        before = ctx.stats
        generation = s.generate(100)
        got = [t.id for t in generation]
        assert generation.finish_reason in ("length", "eos"), generation.finish_reason
        assert got == expected[:len(got)] and len(got) == len(expected)
        assert (ctx.stats - before).tokens_prefilled == len(prompt)  # the history, computed again once


@pytest.mark.parametrize("memo", [True, False])
def test_an_answer_that_meets_the_top_moves_down_and_goes_on_the_same(tiny_model, memo):
    """The history had a free tile above it, so no room was reserved before the first token; its
    answer met the top of the cache after 64 tokens and ended as 'context_full' with most of the
    cache free (cached blocks below). Now the history and the answer so far move down, computed
    again (the answer's tokens in batches that compute like its decode steps): the same 300 tokens
    as a context of its own, the prompt computed once more and the answer's first tokens once more."""
    prompt = text_tokens(tiny_model, 64, seed=14)
    _, expected = reference(tiny_model, prompt, 300)
    with small_context(tiny_model, memo_enabled=memo) as ctx:
        below = ctx.session()
        below.append(text_tokens(tiny_model, 896, seed=15))  # tiles 0-13 of 16
        s = ctx.session()
        s.append(prompt)  # tile 14; tile 15 free above it
        below.close()  # cached blocks, below s
        before = ctx.stats
        generation = s.generate(300)
        got = [t.id for t in generation]
        assert generation.finish_reason in ("length", "eos"), generation.finish_reason
        assert got == expected[:len(got)] and len(got) == len(expected)
        spent = ctx.stats - before
        assert spent.tokens_prefilled == len(prompt)  # the history, computed again once
        if not memo:  # (with memo, the drafts' rows count too) the answer's 64 tokens before the move, once more
            assert spent.tokens_decoded == len(got) - 1 + 64
        assert s.invariant_violation is None


@pytest.mark.parametrize("schedule", ["canonical", "llama"])
@pytest.mark.parametrize("n_ctx", [16, 100, 300])
def test_a_context_smaller_than_a_batch_holds_its_whole_size(tiny_model, n_ctx, schedule):
    """llama.cpp pads n_ctx to a multiple of 256 but capped its batch at the n_ctx asked for: a
    prompt between the two (101 tokens with n_ctx=100) overran the batch and crashed the process.
    The context holds n_ctx (the padded size) tokens in one session; one more is the typed error."""
    kw = {} if schedule == "canonical" else {"schedule": "llama"}
    config = OptConfig(env={}) if schedule == "canonical" else OptConfig(env={}, dedup_enabled=False,
                                                                          diff_enabled=False)
    with Context(tiny_model, n_ctx=n_ctx, n_threads=2, config=config, **kw) as ctx:
        assert ctx.n_ctx == (n_ctx + 255) // 256 * 256
        prompt = text_tokens(tiny_model, ctx.n_ctx, seed=16)
        s = ctx.session()
        s.append(prompt)
        if schedule == "canonical":
            np.testing.assert_array_equal(s.logits(), reference(tiny_model, prompt)[0])
        with pytest.raises(ContextOverflowError, match="more than the context size"):
            s.append(prompt[:1])


def test_an_answer_with_no_room_anywhere_ends_and_keeps_its_history(tiny_model):
    """The rest of the cache is another generation's: the answer cannot move down, so it ends as
    'context_full' — with its history's KV kept (a first version dropped it before finding no room:
    its KV was gone)."""
    prompt = text_tokens(tiny_model, 600, seed=70)
    with small_context(tiny_model) as ctx:
        other = ctx.session()
        other.append(text_tokens(tiny_model, 320, seed=71))  # tiles 0-4
        s = ctx.session()
        s.append(prompt)  # tiles 5-14, tile 15 free above
        busy = other.generate(200)
        next(busy), next(busy)  # its answer takes tile 15
        generation = s.generate(200)
        got = [t.id for t in generation]
        assert generation.finish_reason == "context_full" and len(got) == 41  # tiles 5-14 hold 640 cells
        assert s._core.n_evaluated == len(prompt) + 40  # (the last token has no KV yet)
        assert s.invariant_violation is None
        busy.close()
        s.append(text_tokens(tiny_model, 20, seed=72))
        np.testing.assert_array_equal(s.logits(), reference(tiny_model, s.tokens)[0])
