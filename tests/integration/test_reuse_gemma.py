"""Exact KV reuse on Gemma 3 270M (sliding-window layers included): a multi-turn agent
conversation and interleaved sessions sharing a system prompt give the same tokens and
bitwise the same logits as computing everything from scratch (reuse off)."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig

pytestmark = pytest.mark.integration

SYSTEM = ("You are a coding agent working in a Python repository. Tools: read_file(path), "
          "write_file(path, text), run_tests(). Answer briefly and call one tool per turn.\n" +
          "".join(f"Rule {i}: keep function {i} small, documented and tested; never break test_{i}.\n"
                  for i in range(45)))
TURNS = [
    "User: The test test_add fails. Look at math_utils.py.\nAgent:",
    "Tool result (read_file math_utils.py):\ndef add(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\nAgent:",
    "Tool result (run_tests): 1 failed, 12 passed: test_add expected 5, got -1\nAgent:",
    "User: Fix it and explain the change in one sentence.\nAgent:",
    "Tool result (write_file): ok\nAgent:",
]


def off(kv_type: str = "f16") -> OptConfig:
    return OptConfig(env={}, dedup_enabled=False, diff_enabled=False, kv_type=kv_type)


def converse(gemma, config, sampling):
    """Replays the agent: every turn re-sends the whole transcript. Returns per turn the logits
    before generating and the generated tokens."""
    out = []
    with Context(gemma, n_ctx=4096, n_threads=2, config=config) as ctx:
        session = ctx.session()
        transcript = SYSTEM
        for turn in TURNS:
            transcript += turn
            session.sync(gemma.tokenize(transcript))
            logits = session.logits()
            generation = session.generate(24, stop=["\nUser:", "\nTool"], **sampling)
            out.append((logits, [t.id for t in generation]))
            transcript += generation.text + "\n"
        stats = session.stats
    return out, stats


# seeded sampling once: the quantized types add nothing to what it tests (the CI's time)
@pytest.mark.parametrize("sampling,kv_type", [({}, "f16"), ({"temperature": 0.8, "seed": 7}, "f16"), ({}, "q8_0"),
                                              ({}, "q4_0")], ids=["greedy", "seeded", "greedy-q8_0", "greedy-q4_0"])
def test_agent_conversation_with_reuse_equals_recomputing_everything(gemma, sampling, kv_type):
    assert len(gemma.tokenize(SYSTEM)) > 1024  # twice the sliding window
    reused, stats = converse(gemma, OptConfig(env={}, kv_type=kv_type), sampling)
    baseline, baseline_stats = converse(gemma, off(kv_type), sampling)
    for turn, ((logits, tokens), (ref_logits, ref_tokens)) in enumerate(zip(reused, baseline)):
        assert tokens == ref_tokens, f"turn {turn}"
        np.testing.assert_array_equal(logits, ref_logits, err_msg=f"turn {turn}")
    assert stats.tokens_prefilled < baseline_stats.tokens_prefilled / 3
    assert stats.diff_tokens_unchanged > 0


def test_sessions_sharing_a_system_prompt_equal_isolated_sessions(gemma, kv_type):
    system = gemma.tokenize(SYSTEM)
    questions = [gemma.tokenize(t, add_bos=False) for t in TURNS[:4]]
    isolated = []
    for q in questions:
        with Context(gemma, n_ctx=2048, n_threads=2, config=off(kv_type)) as ctx:
            s = ctx.session()
            s.append(system + q)
            isolated.append((s.logits(), [t.id for t in s.generate(16)]))
    with Context(gemma, n_ctx=8192, n_threads=2, config=OptConfig(kv_type=kv_type)) as ctx:
        sessions = [ctx.session() for _ in questions]
        for s, q in zip(sessions, questions):
            s.append(system + q)
        logits = [s.logits() for s in sessions]
        streams = [iter(s.generate(16)) for s in sessions]
        generated = [[] for _ in sessions]
        for _ in range(16):  # interleaved, as a server would
            for i, stream in enumerate(streams):
                generated[i].append(next(stream).id)
        # stored once: the shared prefix plus each session's own tiles
        suffixes = sum(s.n_tokens - (len(system) // ctx.block_size - 1) * ctx.block_size for s in sessions[1:])
        assert ctx.kv_cells_used <= 1.1 * (sessions[0].n_tokens + suffixes) + 4 * ctx.block_size
        assert ctx.stats.dedup_blocks_hit >= 3 * (len(system) // ctx.block_size - 1)
    for i, (ref_logits, ref_tokens) in enumerate(isolated):
        np.testing.assert_array_equal(logits[i], ref_logits, err_msg=f"session {i}")
        assert generated[i] == ref_tokens, f"session {i}"


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])  # q4_0 is refused (test_kv_type_gemma.py)
def test_tier2_edit_keeps_other_sessions_exact_and_stays_close(gemma, kv_type):
    """Tier 2 on Gemma 3 (both KV caches of the sliding-window model are moved and re-rotated):
    a session syncs a history edited in the middle; an exact session in the same context keeps
    bitwise-exact logits, and the edited session's next-token distribution stays close to
    computing the edited history from scratch (its quality over a whole trace:
    benchmarks/agent_trace.py)."""
    transcript = SYSTEM + "".join(TURNS)
    edited = transcript.replace("return a - b", "return a + b  # fixed")
    other = SYSTEM + TURNS[0] + " I will read math_utils.py first."
    tier2 = OptConfig(env={}, diff_reuse_shifted=True, kv_type=kv_type)
    with Context(gemma, n_ctx=4096, n_threads=2, config=tier2) as ctx:
        exact, approximate = ctx.session(), ctx.session()
        exact.sync(gemma.tokenize(SYSTEM + TURNS[0]))
        approximate.sync(gemma.tokenize(transcript))
        approximate.sync(gemma.tokenize(edited))
        assert approximate.stats.diff_tokens_shifted > 0 and approximate.approx_from is not None
        got = approximate.logits()
        exact.sync(gemma.tokenize(other))
        exact_logits = exact.logits()
    with Context(gemma, n_ctx=4096, n_threads=2, config=off(kv_type)) as ctx:
        s = ctx.session()
        s.sync(gemma.tokenize(edited))
        expected = s.logits()
        s.sync(gemma.tokenize(other))
        np.testing.assert_array_equal(exact_logits, s.logits())
    p = np.exp(expected - expected.max()); p /= p.sum()
    q = np.exp(got - got.max()); q /= q.sum()
    kl = float(np.sum(p * (np.log(p + 1e-30) - np.log(q + 1e-30))))
    assert got.argmax() == expected.argmax()
    assert kl < 0.05  # measured 2e-3 on the agent trace (docs/benchmarks.md)


def test_an_answer_that_meets_the_top_of_the_cache_moves_down_bit_for_bit(gemma, kv_type):
    """tests/test_room.py's case on the real model, sliding-window layers included: a history with
    one free tile above it, cached blocks below, an answer of 300 tokens. It meets the top after
    64 tokens and moves down (history and answer computed again): the same tokens, and the same
    logits bit for bit at the end, as a context of its own."""
    prompt = gemma.tokenize(SYSTEM)[:64]
    filler = gemma.tokenize(SYSTEM * 3)[:896]
    results = []
    for moved in (True, False):
        with Context(gemma, n_ctx=1024, n_batch=256, n_seq_max=8, n_threads=2,
                     config=OptConfig(env={}, kv_type=kv_type)) as ctx:
            below = ctx.session()
            if moved:
                below.append(filler)  # tiles 0-13 of 16
            s = ctx.session()
            s.append(prompt)  # moved: tile 14, one free tile above
            below.close()
            before = ctx.stats
            generation = s.generate(300, temperature=0.0)
            tokens = [t.id for t in generation]
            assert generation.finish_reason == "length"
            results.append((tokens, s.logits(), (ctx.stats - before).tokens_prefilled))
    (moved_tokens, moved_logits, recomputed), (tokens, logits, _) = results
    assert moved_tokens == tokens
    np.testing.assert_array_equal(moved_logits, logits)
    assert recomputed == len(prompt)  # it moved


def test_a_fork_and_its_parent_each_equal_a_session_of_their_own(gemma, kv_type):
    """A fork shares its parent's cells; after the fork each goes its own way, and each gives the
    logits and tokens of a session computing its history alone, in a context of its own."""
    history = gemma.tokenize(SYSTEM + TURNS[0])
    turns = [gemma.tokenize(t, add_bos=False) for t in TURNS[1:3]]
    results = []
    with Context(gemma, n_ctx=4096, n_threads=2, config=OptConfig(env={}, kv_type=kv_type)) as ctx:
        parent = ctx.session()
        parent.append(history)
        used = ctx.kv_cells_used
        fork = parent.fork()
        assert ctx.kv_cells_used - used < 2 * ctx.block_size  # only the last chunk is its own
        for session, turn in zip((parent, fork), turns):
            session.append(turn)
            results.append((session.logits(), [t.id for t in session.generate(12)]))
    for turn, (logits, tokens) in zip(turns, results):
        with Context(gemma, n_ctx=2048, n_threads=2, config=off(kv_type)) as ctx:
            s = ctx.session()
            s.append(history + turn)
            np.testing.assert_array_equal(logits, s.logits())
            assert tokens == [t.id for t in s.generate(12)]
