"""Batched decode steps of several sessions (patches/0006 rows, patches/0007 placement) on the
real model: bitwise the logits and the tokens of each session stepping alone."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig, Session

pytestmark = pytest.mark.integration


def test_gemma_batched_steps_equal_steps_alone(gemma):
    prompts = [gemma.tokenize(text) for text in (
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "Q: What is the boiling point of water at sea level?\nA:",
        "A list of ten animals: 1. cat 2.")]
    config = OptConfig(env={}, memo_enabled=False)  # every step a plain one: all of them batched
    steps = 10
    alone = []
    for prompt in prompts:
        with Context(gemma, n_ctx=2048, n_threads=2, config=config) as ctx:
            s = ctx.session()
            s.append(prompt)
            g = s.generate(steps)
            trace = []
            for _ in range(steps):
                trace.append(s.logits())
                trace.append(next(g).id)
            alone.append(trace)
    with Context(gemma, n_ctx=2048, n_threads=2, config=config) as ctx:
        sessions = [ctx.session() for _ in prompts]
        for s, prompt in zip(sessions, prompts):
            s.append(prompt)
        generations = [s.generate(steps) for s in sessions]
        together: list[list] = [[] for _ in prompts]
        for _ in range(steps):
            before = ctx.stats.forward_passes
            Session.prefetch_steps(sessions)
            batched = ctx.stats.forward_passes - before
            for trace, s, g in zip(together, sessions, generations):
                trace.append(s.logits())
                trace.append(next(g).id)
            assert batched in (0, 1)
        assert ctx.stats.forward_passes < len(prompts) * steps  # the steps were shared
    for a, t in zip(alone, together):
        for x, y in zip(a, t):
            assert np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
