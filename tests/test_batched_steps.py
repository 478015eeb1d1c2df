"""Session.prefetch_steps: the pending decode steps of several generating sessions computed in
shared batches give the tokens and bitwise the logits each session computes alone."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, InvalidArgumentError, Model, OptConfig, Session

PROMPTS = [list(range(10, 10 + n)) for n in (37, 70, 140)]

Trace = list[tuple[list[int], list[np.ndarray]]]  # per session: its tokens, and the logits before each


def step_alone(model: Model, prompts: list[list[int]], config: OptConfig, steps: int, **generate: object) -> Trace:
    out = []
    for prompt in prompts:
        with Context(model, n_ctx=2048, n_threads=2, config=config) as ctx:
            s = ctx.session()
            s.append(prompt)
            g = s.generate(steps, **generate)
            tokens, logits = [], []
            for _ in range(steps):
                logits.append(s.logits())  # the pending token's step, alone
                tokens.append(next(g).id)
            out.append((tokens, logits))
    return out


def step_together(model: Model, prompts: list[list[int]], config: OptConfig, steps: int, repeat: bool = False,
                  **generate: object) -> tuple[Trace, list[int], list[int]]:
    """The same generations advanced in turn, each round's pending steps prefetched together;
    also the forward passes each round's prefetch took, and the memo's drafts it checked.
    `repeat`: each generation ran once before in the context (the memo drafts from its output)."""
    with Context(model, n_ctx=2048, n_threads=2, config=config) as ctx:
        for prompt in prompts if repeat else []:
            with ctx.session() as s:
                s.append(prompt)
                list(s.generate(steps, **generate))
        sessions = [ctx.session() for _ in prompts]
        for s, prompt in zip(sessions, prompts):
            s.append(prompt)
        generations = [s.generate(steps, **generate) for s in sessions]
        out: Trace = [([], []) for _ in sessions]
        passes, drafts = [], []
        for _ in range(steps):
            before = ctx.stats
            Session.prefetch_steps(sessions)
            passes.append(ctx.stats.forward_passes - before.forward_passes)
            drafts.append(ctx.stats.memo_hits - before.memo_hits)
            for (tokens, logits), s, g in zip(out, sessions, generations):
                logits.append(s.logits())  # computed by the shared batch (or alone, if it was not plain)
                tokens.append(next(g).id)
        for g in generations:
            g.close()
        return out, passes, drafts


def assert_same(alone: Trace, together: Trace) -> None:
    for (tokens_a, logits_a), (tokens_t, logits_t) in zip(alone, together):
        assert tokens_t == tokens_a
        for a, t in zip(logits_a, logits_t):
            assert np.array_equal(a, t)


@pytest.mark.parametrize("memo", [False, True])
def test_batched_steps_equal_steps_alone(tiny_model, memo):
    config = OptConfig(env={}, memo_enabled=memo, memo_gate=False)
    together, passes, _ = step_together(tiny_model, PROMPTS, config, 12)
    assert_same(step_alone(tiny_model, PROMPTS, config, 12), together)
    if not memo:  # the first token follows the prompts' prefill; every later step is one shared pass
        assert passes == [0] + [1] * 11


def test_the_memos_draft_checks_of_several_sessions_share_a_pass(tiny_model):
    """Generations that ran before (a request sent again): the sessions' steps check drafts (the
    pending token and the drafted tokens as rows); those of several sessions go through one
    batch, with the tokens and logits of each session alone (after confirmed drafted tokens too)."""
    config = OptConfig(env={}, memo_enabled=True, memo_gate=False)
    together, passes, drafts = step_together(tiny_model, PROMPTS, config, 12, repeat=True)
    assert_same(step_alone(tiny_model, PROMPTS, config, 12), together)
    assert any(p == 1 and d >= 2 for p, d in zip(passes, drafts)), (passes, drafts)


# a schema whose answer leaves the model choices at most steps (a grammar that forces the next
# token needs no logits: that step is taken without a pass, batched or not)
NUMBERS = {"type": "array", "items": {"type": "integer"}, "minItems": 3}


def test_grammar_constrained_steps_are_batched_too(tiny_model):
    """Tool calls and JSON answers are constrained: their steps share batches like plain ones,
    with the same tokens and logits as alone."""
    config = OptConfig(env={})
    together, passes, _ = step_together(tiny_model, PROMPTS, config, 12, json_schema=NUMBERS)
    assert_same(step_alone(tiny_model, PROMPTS, config, 12, json_schema=NUMBERS), together)
    assert sum(p == 1 for p in passes) >= 6, passes  # most rounds: one pass for the three sessions


def test_a_session_that_is_not_generating_is_left_alone(tiny_model):
    with Context(tiny_model, n_ctx=256, n_threads=2) as ctx:
        a, b = ctx.session(), ctx.session()
        a.append(PROMPTS[0])
        b.append(PROMPTS[1])
        before = ctx.stats
        Session.prefetch_steps([a, b])  # nothing is pending: no pass
        assert ctx.stats.forward_passes == before.forward_passes
        with Context(tiny_model, n_ctx=256, n_threads=2) as other:
            with pytest.raises(InvalidArgumentError, match="different contexts"):
                Session.prefetch_steps([a, other.session()])
