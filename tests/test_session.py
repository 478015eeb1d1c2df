"""Session on the tiny model: history, generation, sampling, stop strings, sync, errors,
interruption, several sessions in one context."""
from __future__ import annotations

import gc
import signal
import threading
import time

import numpy as np
import pytest

from pyllamaopt import (
    Context,
    ContextOverflowError,
    InvalidArgumentError,
    InvalidTokenError,
    OptConfig,
    SessionClosedError,
)

PROMPT = "the capital of france is"


def llama_schedule() -> dict:
    """llama.cpp's own schedule, every reuse optimization off: counters as plain as it gets."""
    return {"schedule": "llama", "config": OptConfig(env={}, dedup_enabled=False, diff_enabled=False)}


def test_append_and_history(tiny_model):
    s = Context(tiny_model, n_ctx=256, **llama_schedule()).session()
    tokens = s.append_text(PROMPT)
    assert s.tokens == tokens == tiny_model.tokenize(PROMPT)
    more = s.append_text("paris")
    assert more == tiny_model.tokenize("paris", add_bos=False)  # no second BOS
    assert s.tokens == tokens + more
    assert s.text.split() == (PROMPT + " paris").split()
    assert s.stats.tokens_prefilled == s.n_tokens
    assert s.stats.forward_passes == 2


def test_greedy_is_the_argmax_of_the_logits(tiny_context):
    s = tiny_context.session()
    s.append_text(PROMPT)
    for _ in range(5):
        expected = int(np.argmax(s.logits()))
        token = next(iter(s.generate(1)))
        assert token.id == expected


def test_generation_extends_the_history(tiny_context):
    s = tiny_context.session()
    s.append_text(PROMPT)
    n = s.n_tokens
    generation = s.generate(12)
    pieces = [t.text for t in generation]
    assert generation.finish_reason in ("length", "eos")
    assert s.tokens[n:] == generation.tokens
    assert "".join(pieces) == generation.text
    assert s.stats.tokens_generated == len(generation.tokens)
    # one forward pass per generated token after the first (its logits come from the prompt)
    assert s.stats.forward_passes == 1 + len(generation.tokens) - 1


def test_greedy_is_deterministic_across_contexts(tiny_model):
    outputs = []
    for n_threads in (1, 2):
        with Context(tiny_model, n_ctx=512, n_batch=64, n_threads=n_threads) as ctx:
            s = ctx.session()
            s.append_text(PROMPT)
            outputs.append((_ids(s.generate(30)), s.logits()))
    assert outputs[0][0] == outputs[1][0]
    np.testing.assert_array_equal(outputs[0][1], outputs[1][1])  # thread count never changes a bit


def _ids(generation):
    return [t.id for t in generation]


def test_seeded_sampling_is_reproducible(tiny_context):
    def sample(seed):
        s = tiny_context.session()
        s.append_text(PROMPT)
        out = _ids(s.generate(20, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed))
        s.close()
        return out

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_max_tokens(tiny_context):
    s = tiny_context.session()
    s.append_text(PROMPT)
    g = s.generate(0)
    assert list(g) == [] and g.finish_reason == "length"
    g = s.generate(3)
    assert len(list(g)) == 3


@pytest.mark.parametrize("bad", [-1, 10**9, 1.5, True, "3"])
def test_bad_max_tokens(tiny_context, bad):
    s = tiny_context.session()
    s.append_text(PROMPT)
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        s.generate(bad)


def test_bad_sampling_arguments(tiny_context):
    s = tiny_context.session()
    s.append_text(PROMPT)
    for kwargs in ({"temperature": -1}, {"top_p": float("nan")}, {"seed": -5}, {"stop": [""]}, {"stop": [3]}):
        with pytest.raises(InvalidArgumentError):
            s.generate(5, **kwargs)


@pytest.mark.parametrize("kwargs", [{"top_p": 2}, {"top_p": 0}, {"top_p": -0.5}, {"top_k": -1}, {"top_k": 2.5},
                                    {"top_k": True}, {"min_p": 1.5}, {"min_p": -0.1},
                                    {"temperature": float("inf")}, {"temperature": "0.5"}])
def test_out_of_range_sampling_values_are_refused(tiny_context, kwargs):
    """Issue 20: top_p=2, top_p <= 0 and a negative top_k were accepted silently."""
    s = tiny_context.session()
    s.append_text(PROMPT)
    name = next(iter(kwargs))
    with pytest.raises(InvalidArgumentError, match=name):
        s.generate(5, **kwargs)
    assert len(list(s.generate(3, top_p=1, top_k=0, min_p=0))) <= 3  # the edges are valid: "off"


def test_stop_strings_end_generation_and_are_removed(tiny_context):
    s = tiny_context.session()
    s.append_text(PROMPT)
    free = s.generate(40)
    list(free)
    text = free.text
    assert len(text) > 6, "the tiny model should produce some text"
    stop = text[3:6]
    s2 = tiny_context.session()
    s2.append_text(PROMPT)
    g = s2.generate(40, stop=[stop, "\x00never"])
    streamed = "".join(t.text for t in g)
    assert g.finish_reason == "stop"
    assert g.text == streamed == text[: text.index(stop)]


def test_stop_string_never_streams_partially(tiny_context):
    s = tiny_context.session()
    s.append_text(PROMPT)
    free = s.generate(40)
    list(free)
    # a stop string that only matches at the very end: its beginning must be held back
    stop = free.text[-4:] + "\x01"
    s2 = tiny_context.session()
    s2.append_text(PROMPT)
    g = s2.generate(40, stop=stop)
    streamed = "".join(t.text for t in g)
    assert g.finish_reason == "length"
    assert streamed == g.text == free.text  # released at the end, complete


def test_generation_stops_when_the_context_is_full(tiny_model):
    with Context(tiny_model, n_ctx=32, n_batch=16, n_threads=2, **llama_schedule()) as ctx:
        s = ctx.session()
        s.append_text(PROMPT)
        g = s.generate(None)
        list(g)
        assert g.finish_reason in ("context_full", "eos")
        if g.finish_reason == "context_full":
            assert s.n_tokens == ctx.n_ctx


def test_overflowing_append_leaves_the_session_unchanged(tiny_model):
    with Context(tiny_model, n_ctx=64, n_batch=16, n_threads=2, **llama_schedule()) as ctx:
        s = ctx.session()
        s.append_text(PROMPT)
        before_tokens, before_stats, before_logits = s.tokens, s.stats, s.logits()
        with pytest.raises(ContextOverflowError, match="n_ctx"):
            s.append([5] * ctx.n_ctx)
        with pytest.raises(ContextOverflowError):
            s.sync(s.tokens + [5] * ctx.n_ctx)
        assert s.tokens == before_tokens
        assert s.stats == before_stats
        np.testing.assert_array_equal(s.logits(), before_logits)
        reference = ctx.session()
        reference.append(before_tokens)
        assert _ids(s.generate(10)) == _ids(reference.generate(10))


@pytest.mark.parametrize("bad", [[-1], [10**6], [2**40], ["a"], [None], [1.0]])
def test_bad_tokens_leave_the_session_unchanged(tiny_context, bad):
    s = tiny_context.session()
    s.append_text(PROMPT)
    before = s.tokens
    with pytest.raises(InvalidTokenError):
        s.append([5] + bad)
    with pytest.raises(InvalidTokenError):
        s.sync(before + bad)
    assert s.tokens == before


def test_generate_on_an_empty_session(tiny_context):
    with pytest.raises(InvalidArgumentError, match="append a prompt"):
        list(tiny_context.session().generate(3))


def test_closed_session(tiny_context):
    s = tiny_context.session()
    s.append_text(PROMPT)
    s.close()
    assert s.closed
    for action in (lambda: s.append([5]), lambda: list(s.generate(2)), lambda: s.sync([1, 5]), s.logits):
        with pytest.raises(SessionClosedError, match="closed"):
            action()
    s.close()  # closing twice is fine


def test_closing_the_context_closes_its_sessions(tiny_model):
    ctx = Context(tiny_model, n_ctx=256, n_threads=2)
    s = ctx.session()
    s.append_text(PROMPT)
    ctx.close()
    assert s.closed and ctx.closed
    with pytest.raises(SessionClosedError):
        s.append([5])
    with pytest.raises(SessionClosedError):
        ctx.session()


def test_session_slots_are_limited_and_reused(tiny_model):
    with Context(tiny_model, n_ctx=256, n_seq_max=2, n_threads=2) as ctx:
        a, b = ctx.session(), ctx.session()
        with pytest.raises(ContextOverflowError, match="n_seq_max"):
            ctx.session()
        a.close()
        c = ctx.session()
        assert ctx.n_sessions == 2
        del b, c


def test_interleaved_sessions_match_isolated_ones(tiny_model):
    prompts = [PROMPT, "hello world, this is a test of the code", "python function return value list"]
    with Context(tiny_model, n_ctx=1024, n_batch=64, n_threads=2) as ctx:
        isolated = []
        for p in prompts:
            s = ctx.session()
            s.append_text(p)
            isolated.append(_ids(s.generate(16)))
            s.close()
        sessions = [ctx.session() for _ in prompts]
        for s, p in zip(sessions, prompts):
            s.append_text(p)
        generations = [iter(s.generate(16)) for s in sessions]
        interleaved = [[] for _ in prompts]
        for _ in range(16):
            for i, g in enumerate(generations):
                interleaved[i].append(next(g).id)
        assert interleaved == isolated


def test_sync_without_diffing_recomputes_everything(tiny_model):
    with Context(tiny_model, n_ctx=256, **llama_schedule()) as ctx:
        s = ctx.session()
        first = tiny_model.tokenize(PROMPT + " paris and the world")
        s.sync(first)
        s.sync(first[:-2] + tiny_model.tokenize(" code file", add_bos=False))
        assert s.stats.tokens_prefilled == len(first) + s.n_tokens
        assert s.stats.diff_tokens_total == 0  # the diff path did not run


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt, as in a terminal, even where this run inherited SIGINT
    ignored (a job started in the background by a non-interactive shell does)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_generation_leaves_the_session_usable(tiny_model, ctrl_c_raises):
    """Ctrl-C mid-generation: the generation ends 'interrupted' holding every token the history got
    (the interrupt lands inside the step, after it committed its token: without taking it, the
    generation was one token short of the history), and the session goes on."""
    # one decode step per token (memo drafts off: a step that takes a checked draft does no work)
    with Context(tiny_model, n_ctx=32768, n_batch=64, n_threads=2, config=OptConfig(memo_enabled=False)) as ctx:
        s = ctx.session()
        s.append_text(PROMPT)
        main = threading.main_thread().ident
        for _ in range(5):  # most of a step's time is in the engine: most tries test the case
            start = s.n_tokens
            g = s.generate(None)
            timer = threading.Timer(0.2, lambda: signal.pthread_kill(main, signal.SIGINT))
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                for _ in g:
                    pass
            timer.join()
            assert g.finish_reason == "interrupted"
            assert 0 < len(g.tokens) < s.context.n_ctx - start, "the interrupt should arrive mid-generation"
            assert g.tokens == s.tokens[start:]
            pieces = b"".join(tiny_model._core.token_piece(t, False) for t in g.tokens)
            assert g.text == pieces.decode("utf-8", "replace")
        n = s.n_tokens
        s.append_text(" paris")
        assert len(list(s.generate(5))) == 5
        assert s.n_tokens == n + len(s.context.model.tokenize(" paris", add_bos=False)) + 5


def test_generate_on_a_closed_session_fails_at_once_and_stop_none_means_none(tiny_context):
    s = tiny_context.session()
    s.append_text(PROMPT)
    assert len(list(s.generate(3, stop=None))) == 3
    s.close()
    with pytest.raises(SessionClosedError):
        s.generate(3)  # not at the first token


def test_a_generation_that_begins_ends_the_one_in_progress(tiny_context):
    """One turn at a time: a generation that begins (at generate(), or at its first token if it was
    made earlier) ends the session's generation in progress ('interrupted'), which stops there.
    Before, the first went on with the second's grammar and budget, and the second's end ended
    the first's turn. A history changed mid-generation stays the engine's business (test_memo)."""
    s = tiny_context.session()
    s.append_text(PROMPT)
    start = s.n_tokens
    constrained = 'root ::= "yes" | "no"'
    made_before = s.generate(3)
    first = s.generate(12, grammar=constrained)
    taken = next(first)
    second = s.generate(12)  # begins: the first ends here
    assert first.finish_reason == "interrupted" and list(first) == []
    assert s.tokens[start:] == [taken.id] == first.tokens
    assert len(list(second)) == 12 and second.finish_reason == "length"
    s.sync(s.tokens[:start])
    third = s.generate(12, grammar=constrained)
    next(third)
    assert len(list(made_before)) == 3 and third.finish_reason == "interrupted"  # its first token ended it
    s.sync(s.tokens[:start])
    alone = s.generate(12, grammar=constrained)
    assert "".join(t.text for t in alone) in ("yes", "no") and alone.finish_reason in ("eos", "grammar")


def test_per_turn_statistics_on_stderr(tiny_model, monkeypatch, capfd):
    monkeypatch.setenv("LLAMA_OPT_STATS", "1")
    with Context(tiny_model, n_ctx=256, n_threads=2) as ctx:
        s = ctx.session()
        s.append_text(PROMPT)
        list(s.generate(4))
    err = capfd.readouterr().err
    assert "[llama-opt stats]" in err
    assert "generated=4" in err


def test_context_stats_sum_the_sessions(tiny_context):
    a, b = tiny_context.session(), tiny_context.session()
    a.append_text(PROMPT)
    b.append_text("hello world")
    assert tiny_context.stats.tokens_prefilled == a.stats.tokens_prefilled + b.stats.tokens_prefilled
    assert tiny_context.stats.as_dict()["forward_passes"] == 2
    tiny_context.reset_stats()
    assert tiny_context.stats.tokens_prefilled == 0


def test_context_stats_keep_what_gone_sessions_counted(tiny_context):
    """Each count is written once, to the session's statistics, which the context adds up: a
    session closed and freed stays in the sum; after reset_stats, what live sessions count from then on."""
    kept, gone = tiny_context.session(), tiny_context.session()
    kept.append_text(PROMPT)
    gone.append_text("hello world")
    total = kept.stats.tokens_prefilled + gone.stats.tokens_prefilled
    gone.close()
    del gone
    gc.collect()
    assert tiny_context.stats.tokens_prefilled == total > 0
    tiny_context.reset_stats()
    assert tiny_context.stats.tokens_prefilled == 0
    before = kept.stats
    list(kept.generate(3))
    assert tiny_context.stats.tokens_decoded == (kept.stats - before).tokens_decoded > 0
    assert tiny_context.stats.tokens_generated == 3


def test_forward_us_is_the_time_inside_the_forward_passes(tiny_context):
    s = tiny_context.session()
    start = time.perf_counter()
    s.append_text(PROMPT)
    wall_us = (time.perf_counter() - start) * 1e6
    assert 0 < s.stats.forward_us <= wall_us
    before = s.stats
    start = time.perf_counter()
    assert s.generate_text(8)
    wall_us = (time.perf_counter() - start) * 1e6
    spent = s.stats - before
    assert spent.forward_passes > 0 and 0 < spent.forward_us <= wall_us
    # the context's time is the sum of its sessions'
    other = tiny_context.session()
    other.append_text("hello world")
    assert tiny_context.stats.forward_us == s.stats.forward_us + other.stats.forward_us


@pytest.mark.parametrize("kwargs", [{"n_ctx": 0}, {"n_ctx": -5}, {"n_batch": 0}, {"n_seq_max": 0},
                                    {"n_seq_max": 1000}, {"n_threads": -1}, {"n_ctx": "big"}])
def test_bad_context_arguments(tiny_model, kwargs):
    with pytest.raises(InvalidArgumentError):
        Context(tiny_model, **kwargs)


def test_generate_defaults_are_the_engines_defaults():
    """Session.generate's sampling defaults and the engine's (llama_opt_sampling) are one set."""
    import inspect

    from pyllamaopt import Session, _core

    engine = _core.Sampling()
    params = inspect.signature(Session.generate).parameters
    for name in ("temperature", "top_k", "top_p", "min_p"):
        assert params[name].default == pytest.approx(getattr(engine, name), rel=1e-6), name  # float32 in C++
    assert params["seed"].default is None and engine.seed is None  # None: random
    engine.seed = 7
    assert engine.seed == 7


def test_a_pinned_session_is_not_evicted_for_room(tiny_model):
    """Session.pinned: while set, another session that needs the KV cache's room gets
    ContextOverflowError instead of evicting it (as while it generates); unpinned, it is evictable."""
    with Context(tiny_model, n_ctx=512, n_threads=2, n_seq_max=3, config=OptConfig(env={}, dedup_enabled=False)) as ctx:
        kept, other = ctx.session(), ctx.session()
        kept.append([10 + i % 300 for i in range(400)])
        kept.pinned = True
        with pytest.raises(ContextOverflowError):
            other.append([20 + i % 300 for i in range(400)])
        assert not kept.evicted and kept.n_tokens == 400 and other.n_tokens == 0
        assert len(list(kept.generate(3))) == 3
        kept.pinned = False
        other.append([20 + i % 300 for i in range(400)])
        assert kept.evicted and other.n_tokens == 400
