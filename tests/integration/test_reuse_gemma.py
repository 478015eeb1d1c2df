"""Exact KV reuse on Gemma 3 270M (sliding-window layers included) and, for the tests taking
`family_kv_model`, on each model family and KV cache type (families.FAMILY_KV_TYPES): a multi-turn
agent conversation, interleaved sessions sharing a system prompt and forks give the same tokens
and bitwise the same logits as computing everything from scratch (reuse off) with the same KV
cache type."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig

from families import greedy_everywhere_seeded_on_f16, kv_options

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
    return OptConfig(env={}, dedup_enabled=False, diff_enabled=False, **kv_options(kv_type))


def converse(model, config, sampling):
    """Replays the agent: every turn re-sends the whole transcript. Returns per turn the logits
    before generating and the generated tokens."""
    out = []
    with Context(model, n_ctx=4096, n_threads=2, config=config) as ctx:
        session = ctx.session()
        transcript = SYSTEM
        for turn in TURNS:
            transcript += turn
            session.sync(model.tokenize(transcript))
            logits = session.logits()
            generation = session.generate(24, stop=["\nUser:", "\nTool"], **sampling)
            out.append((logits, [t.id for t in generation]))
            transcript += generation.text + "\n"
        stats = session.stats
    return out, stats


@pytest.mark.parametrize(("family_kv_path", "sampling"), greedy_everywhere_seeded_on_f16({"temperature": 0.8, "seed": 7}),
                         indirect=["family_kv_path"])
def test_agent_conversation_with_reuse_equals_recomputing_everything(family_kv_model, sampling):
    model, kv_type = family_kv_model
    assert len(model.tokenize(SYSTEM)) > 1024  # twice Gemma's sliding window
    reused, stats = converse(model, OptConfig(env={}, **kv_options(kv_type)), sampling)
    baseline, baseline_stats = converse(model, off(kv_type), sampling)
    for turn, ((logits, tokens), (ref_logits, ref_tokens)) in enumerate(zip(reused, baseline)):
        assert tokens == ref_tokens, f"turn {turn}"
        np.testing.assert_array_equal(logits, ref_logits, err_msg=f"turn {turn}")
    assert stats.tokens_prefilled < baseline_stats.tokens_prefilled / 3
    assert stats.diff_tokens_unchanged > 0


def test_sessions_sharing_a_system_prompt_equal_isolated_sessions(family_kv_model):
    model, kv_type = family_kv_model
    system = model.tokenize(SYSTEM)
    questions = [model.tokenize(t, add_bos=False) for t in TURNS[:4]]
    isolated = []
    for q in questions:
        with Context(model, n_ctx=2048, n_threads=2, config=off(kv_type)) as ctx:
            s = ctx.session()
            s.append(system + q)
            isolated.append((s.logits(), [t.id for t in s.generate(16)]))
    with Context(model, n_ctx=8192, n_threads=2, config=OptConfig(env={}, **kv_options(kv_type))) as ctx:
        sessions = [ctx.session() for _ in questions]
        for s, q in zip(sessions, questions):
            s.append(system + q)
        logits = [s.logits() for s in sessions]
        streams = [iter(s.generate(16)) for s in sessions]
        generated = [[] for _ in sessions]
        for _ in range(16):  # interleaved, as a server would (an answer may end sooner: q8_0/q4_0's does)
            for i, stream in enumerate(streams):
                token = next(stream, None)
                if token is not None:
                    generated[i].append(token.id)
        # stored once: the shared prefix plus each session's own tiles
        suffixes = sum(s.n_tokens - (len(system) // ctx.block_size - 1) * ctx.block_size for s in sessions[1:])
        assert ctx.kv_cells_used <= 1.1 * (sessions[0].n_tokens + suffixes) + 4 * ctx.block_size
        assert ctx.stats.dedup_blocks_hit >= 3 * (len(system) // ctx.block_size - 1)
    for i, (ref_logits, ref_tokens) in enumerate(isolated):
        np.testing.assert_array_equal(logits[i], ref_logits, err_msg=f"session {i}")
        assert generated[i] == ref_tokens, f"session {i}"


def scratch(model, tokens, kv_type="f16", n_gen=16):
    """The logits after `tokens` and the greedy tokens that follow, computed in a context of their own
    with every reuse off."""
    with Context(model, n_ctx=4096, n_threads=2, config=off(kv_type)) as ctx:
        s = ctx.session()
        s.append(tokens)
        return s.logits(), [t.id for t in s.generate(n_gen)]


def test_a_fork_equals_computing_its_history(family_kv_model):
    """A fork shares its parent's KV, generated tokens included, and goes on as if its whole
    history (prompt, the parent's answer, a new message) had been computed in a context of its own;
    the parent, after the fork, too."""
    model, kv_type = family_kv_model
    prompt = model.tokenize(SYSTEM + TURNS[0])
    follow_up = model.tokenize("\n" + TURNS[1], add_bos=False)
    with Context(model, n_ctx=4096, n_threads=2, config=OptConfig(env={}, **kv_options(kv_type))) as ctx:
        parent = ctx.session()
        parent.append(prompt)
        parent.generate_text(24)
        answered = parent.tokens
        assert len(answered) > len(prompt)
        used = ctx.kv_cells_used
        twin = parent.fork()
        assert ctx.kv_cells_used - used < 2 * ctx.block_size  # only the last chunk is its own
        assert twin.tokens == answered
        twin.append(follow_up)
        got = [(twin.logits(), [t.id for t in twin.generate(16)])]
        assert twin.stats.tokens_prefilled < len(answered) - len(prompt) + len(follow_up) + 2 * ctx.block_size
        parent.append(follow_up[:5])
        got.append((parent.logits(), [t.id for t in parent.generate(16)]))
    for (logits, tokens), history in zip(got, (answered + follow_up, answered + follow_up[:5])):
        expected_logits, expected_tokens = scratch(model, history, kv_type)
        np.testing.assert_array_equal(logits, expected_logits)
        assert tokens == expected_tokens


# a q4_0 K is refused (test_kv_type_gemma.py); V rows move as they are stored, whatever their type
@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "q8_0/q4_0"])
def test_tier2_edit_keeps_other_sessions_exact_and_stays_close(gemma, kv_type):
    """Tier 2 on Gemma 3 (both KV caches of the sliding-window model are moved and re-rotated):
    a session syncs a history edited in the middle; an exact session in the same context keeps
    bitwise-exact logits, and the edited session's next-token distribution stays close to
    computing the edited history from scratch (its quality over a whole trace:
    benchmarks/agent_trace.py)."""
    transcript = SYSTEM + "".join(TURNS)
    edited = transcript.replace("return a - b", "return a + b  # fixed")
    other = SYSTEM + TURNS[0] + " I will read math_utils.py first."
    tier2 = OptConfig(env={}, diff_reuse_shifted=True, **kv_options(kv_type))
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
                     config=OptConfig(env={}, **kv_options(kv_type))) as ctx:
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
