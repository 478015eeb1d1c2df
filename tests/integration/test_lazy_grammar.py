"""Lazy grammars on SmolLM2 135M Instruct, as llama.cpp applies a chat format's tool-call grammar
(Session.generate's grammar_triggers; methods/grammar-trigger): until a trigger fires the output
is the one without a grammar, token for token and logit for logit; from the trigger's match on
(inside a token too) the output is the grammar's, the tokens it forces taken without logits
exactly as computed ones; and llama.cpp's own lazy grammar of the Qwen2.5 template's tool calls
waits while the model writes text."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from pyllamaopt import ChatTemplate, Context, GrammarError, InvalidArgumentError, Model, OptConfig
from upstream_programs import templates_dir

pytestmark = pytest.mark.integration

QUESTION = "Write two sentences about the river Seine in Paris."
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ENDING = " 42."  # what the test grammars make of the output after their trigger


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> Model:
    return Model(smollm2_path)


def prompt_of(model: Model) -> list[int]:
    template = ChatTemplate.for_model(model)
    return model.tokenize(template.render([{"role": "user", "content": QUESTION}]), add_bos=False, special=True)


def run(model: Model, prompt: list[int], max_tokens: int = 48, config: dict[str, Any] | None = None,
        **generate: Any) -> tuple[list[int], str, str, list[Any], np.ndarray, Any]:
    """tokens, text, finish reason, log-probabilities, the logits after the last token, the stats."""
    with Context(model, n_ctx=1024, n_batch=256, n_threads=2, config=OptConfig(env={}, **(config or {}))) as ctx:
        s = ctx.session()
        s.append(prompt)
        before = s.stats
        g = s.generate(max_tokens, **generate)
        tokens = [t.id for t in g]
        logprobs = [t.logprob for t in g] if generate.get("logprobs") is not None else []
        return tokens, g.text, g.finish_reason, logprobs, s.logits(), s.stats - before


def gbnf_literal(text: str) -> str:
    return json.dumps(text)  # (GBNF's string literals escape as JSON's do, for this text)


def regex_escape(text: str) -> str:
    """ECMAScript's escaping of the characters with a meaning (common/regex-partial's regex_escape)."""
    return "".join("\\" + ch if ch in r".^$|()[]{}*+?\/-" else ch for ch in text)


@pytest.fixture(scope="module")
def free(smollm2) -> tuple[list[int], str, str, list[Any], np.ndarray, Any]:
    """SmolLM2's greedy answer without a grammar, with log-probabilities."""
    return run(smollm2, prompt_of(smollm2), logprobs=3)


def lazy_call_grammar(template: str) -> tuple[str, list[tuple[str, str | int]]]:
    """llama.cpp's grammar of the template's tool calls with tool_choice "auto", and its triggers."""
    rendered = ChatTemplate.from_file(templates_dir() / template).apply(
        {"messages": [{"role": "user", "content": QUESTION}], "tools": [WEATHER], "tool_choice": "auto"})
    assert rendered.grammar_lazy and rendered.grammar_triggers
    return rendered.grammar, [(kind, token if kind == "token" else value)
                              for kind, value, token in rendered.grammar_triggers]


def test_llama_cpps_lazy_call_grammar_that_never_fires_is_no_grammar(smollm2, free):
    """The Qwen2.5 template's call grammar with tool_choice "auto" (triggered by "<tool_call>\\n"):
    SmolLM2 answers in text, the same tokens with the same log-probabilities (bitwise) and the same
    logits after them as without a grammar; greedy and seeded sampling, forced-token skipping on."""
    grammar, triggers = lazy_call_grammar("Qwen-Qwen2.5-7B-Instruct.jinja")
    assert triggers == [("word", "<tool_call>\n")]
    lazy = run(smollm2, prompt_of(smollm2), logprobs=3, grammar=grammar, grammar_triggers=triggers)
    assert "<tool_call>" not in free[1] and lazy[:3] == free[:3]
    assert [(p.token, p.logprob, p.top) for p in lazy[3]] == [(p.token, p.logprob, p.top) for p in free[3]]
    assert np.array_equal(lazy[4], free[4])
    assert lazy[5].schema_tokens_total == 0
    without_logprobs = run(smollm2, prompt_of(smollm2), grammar=grammar, grammar_triggers=triggers)
    assert without_logprobs[:3] == free[:3]
    sampled = [run(smollm2, prompt_of(smollm2), temperature=0.9, seed=7, **extra)[:3]
               for extra in ({}, {"grammar": grammar, "grammar_triggers": triggers})]
    assert sampled[0] == sampled[1]


def trigger_in(model: Model, free_tokens: list[int]) -> tuple[int, str]:
    """A token in the middle of the free answer, and a word that starts inside it (its text but the
    first character) whose first occurrence in the answer ends where that token ends."""
    text = ""
    for k, token in enumerate(free_tokens):
        piece = model.detokenize([token])
        text += piece
        word = piece[1:]
        if k >= 8 and len(word) >= 3 and word.strip() == word and text.find(word) == len(text) - len(word):
            return k, word
    raise AssertionError(f"no token to trigger on in {text!r}")


@pytest.mark.parametrize("kind", ["word", "pattern", "pattern_full", "token"])
def test_after_the_trigger_the_output_is_the_grammars(smollm2, free, kind):
    """The output until the trigger is the free one; then the grammar takes the text from the
    match on (a word starting inside a token: that token's text in part) and its constraint holds
    to the end: the trigger's text, then " 42.", then the end of generation."""
    tokens, text = free[0], free[1]
    k, word = trigger_in(smollm2, tokens)
    piece = smollm2.detokenize([tokens[k]])
    start = text.find(word)
    trigger: tuple[str, str | int]
    if kind == "token":  # the grammar takes the whole token, where it first comes
        k = tokens.index(tokens[k])
        trigger, word, start = (kind, tokens[k]), piece, len(smollm2.detokenize(tokens[:k]))
    elif kind == "word":
        trigger = (kind, word)
    elif kind == "pattern":  # the grammar starts at the first capturing group that matched
        trigger = (kind, "[a-z]*(" + regex_escape(word) + ")")
    else:  # the whole output matches
        trigger = (kind, "[\\s\\S]*?(" + regex_escape(word) + ")[\\s\\S]*")
    grammar = f"root ::= {gbnf_literal(word)} {gbnf_literal(ENDING)}"
    for config in ({}, {"schema_skip_enabled": False}):
        lazy = run(smollm2, prompt_of(smollm2), config=config, grammar=grammar, grammar_triggers=[trigger])
        assert lazy[1] == text[:start] + word + ENDING and lazy[2] == "eos", (lazy[1], text)
        assert lazy[0][:k + 1] == tokens[:k + 1]  # the free tokens up to the trigger
        assert lazy[5].schema_tokens_total > 0
    forced = run(smollm2, prompt_of(smollm2), grammar=grammar, grammar_triggers=[trigger], logprobs=1)
    assert forced[0] == lazy[0]  # skipping forced tokens or computing them: the same tokens


def test_a_trigger_the_grammar_does_not_start_with_ends_the_output(smollm2, free):
    """The text from the trigger on does not fit the grammar: it allows nothing more (llama.cpp's
    sampler throws there), finish_reason 'grammar'."""
    k, word = trigger_in(smollm2, free[0])
    lazy = run(smollm2, prompt_of(smollm2), grammar='root ::= "{}"', grammar_triggers=[("word", word)])
    assert lazy[2] == "grammar" and lazy[0] == free[0][:k + 1]


@pytest.mark.parametrize("triggers, error", [
    ([("regex", "x")], InvalidArgumentError), ([("token", -1)], InvalidArgumentError),
    ([("word", "")], InvalidArgumentError), (["<tool_call>"], InvalidArgumentError),
    ([("pattern", "(unclosed")], GrammarError)])
def test_bad_triggers_are_refused_before_generating(smollm2, triggers, error):
    with Context(smollm2, n_ctx=256, n_threads=2) as ctx:
        s = ctx.session()
        s.append_text("Hi")
        with pytest.raises(error):
            s.generate(4, grammar='root ::= "a"', grammar_triggers=triggers)
        with pytest.raises(InvalidArgumentError, match="grammar="):
            s.generate(4, grammar_triggers=[("word", "a")])
        assert s.generate_text(4)  # the session goes on
