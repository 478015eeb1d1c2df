"""Batched decode steps of several sessions (patches/0006 rows, patches/0007 placement) on the
real model: bitwise the logits and the tokens of each session stepping alone."""
from __future__ import annotations

import pytest
from test_batched_steps import assert_same, step_alone, step_together

from pyllamaopt import OptConfig

pytestmark = pytest.mark.integration


def test_gemma_batched_steps_equal_steps_alone(gemma):
    prompts = [gemma.tokenize(text) for text in (
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "Q: What is the boiling point of water at sea level?\nA:",
        "A list of ten animals: 1. cat 2.")]
    config = OptConfig(env={}, memo_enabled=False)  # every step a plain one: all of them batched
    together, passes, _ = step_together(gemma, prompts, config, 10)
    assert passes == [0] + [1] * 9  # four sessions' steps, one pass each round
    assert_same(step_alone(gemma, prompts, config, 10), together)


def test_gemma_draft_checks_of_several_sessions_batched_equal_steps_alone(gemma):
    """Requests sent again (the memo drafts from the earlier outputs): the draft checks of
    several sessions share batches, bitwise as each session alone."""
    prompts = [gemma.tokenize(text) for text in (
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "A list of ten animals: 1. cat 2.",
        "The capital of France is")]
    config = OptConfig(env={}, memo_enabled=True, memo_gate=False)
    together, passes, drafts = step_together(gemma, prompts, config, 24, repeat=True)
    assert any(p == 1 and d >= 2 for p, d in zip(passes, drafts)), (passes, drafts)
    assert_same(step_alone(gemma, prompts, config, 24), together)


def test_gemma_grammar_constrained_steps_batched_equal_steps_alone(gemma):
    """JSON answers under a schema (as tool calls are): batched, bitwise as alone."""
    prompts = [gemma.tokenize(text) for text in (
        'A person as JSON: {"name": "Ada", "age": 36}\nAnother person as JSON:',
        "The weather in Paris as JSON:")]
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    config = OptConfig(env={}, memo_enabled=False)
    together, passes, _ = step_together(gemma, prompts, config, 10, json_schema=schema)
    assert sum(p == 1 for p in passes) >= 5, passes
    assert_same(step_alone(gemma, prompts, config, 10, json_schema=schema), together)
