"""Logit biases and repetition penalties (session/logit-adjust) on the tiny models: each pick is
the argmax of the logits as llama.cpp's logit_bias and penalties samplers change them (checked
against the formula, in float32, over the generation's own logits: the penalties look back over
the last repeat_last_n tokens, the prompt's included); memo drafts and tokens the grammar forces
stay exact with them (a sampler with state sees every token that joins the history); a finite
bias does not override the grammar; bad values are refused before generating."""
from __future__ import annotations

import re

import numpy as np
import pytest

from pyllamaopt import InvalidArgumentError
from test_memo import repetitive_prompt
from test_reuse import context, text_tokens
from test_structured import FORCING, word_ids, words_model  # noqa: F401 (a fixture)

N_GEN = 40


def generation_and_logits(model, prompt, n=N_GEN, **sampling):
    """The tokens of a greedy generation, the logits each was picked from, and the session's stats."""
    with context(model, memo_enabled=False) as ctx:
        s = ctx.session()
        s.append(prompt)
        logits = [s.logits()]
        tokens = []
        for token in s.generate(n, **sampling):
            tokens.append(token.id)
            logits.append(s.logits())
        return tokens, logits[:len(tokens)]


def run(model, prompt, n, config, **sampling):
    """A generation on a context with `config`: its tokens, text, schema_valid and stats."""
    with context(model, **config) as ctx:
        s = ctx.session()
        s.append(prompt)
        before = s.stats
        g = s.generate(n, **sampling)
        tokens = [t.id for t in g]
        return tokens, g.text, g.schema_valid, s.stats - before


def adjusted(logits, history, bias=None, frequency=0.0, presence=0.0, repeat=1.0, last_n=64):
    """llama.cpp's logit_bias, then penalties (src/llama-sampler.cpp), in float32."""
    out = np.array(logits, dtype=np.float32)
    for token, value in (bias or {}).items():
        out[token] += np.float32(value)
    window = history[-last_n:] if last_n else []
    for token in set(window):
        count = window.count(token)
        x = out[token]
        x = x * np.float32(repeat) if x <= 0 else x / np.float32(repeat)
        out[token] = x - (np.float32(count) * np.float32(frequency) + np.float32(presence))
    return out


@pytest.mark.parametrize("penalties", [
    {"frequency_penalty": 2.0},
    {"presence_penalty": 1.5},
    {"frequency_penalty": -0.5, "presence_penalty": 0.5},
    {"repeat_penalty": 3.0, "repeat_last_n": 32},
    {"frequency_penalty": 1.0, "repeat_penalty": 1.1, "repeat_last_n": 200},
], ids=["frequency", "presence", "negative-frequency", "repeat-32", "all-200"])
def test_each_pick_is_the_argmax_of_llama_cpps_penalized_logits(tiny_model, penalties):
    prompt = repetitive_prompt(tiny_model)
    plain, _ = generation_and_logits(tiny_model, prompt)
    tokens, logits = generation_and_logits(tiny_model, prompt, **penalties)
    assert tokens != plain  # the penalties changed the text
    args = {"frequency": penalties.get("frequency_penalty", 0.0), "presence": penalties.get("presence_penalty", 0.0),
            "repeat": penalties.get("repeat_penalty", 1.0), "last_n": penalties.get("repeat_last_n", 64)}
    for i, (token, seen) in enumerate(zip(tokens, logits)):
        assert token == int(np.argmax(adjusted(seen, prompt + tokens[:i], **args))), i


def test_a_bias_changes_the_pick_as_its_logit_would_and_minus_100_bans(tiny_model):
    prompt = text_tokens(tiny_model, 60, seed=5)
    plain, _ = generation_and_logits(tiny_model, prompt, n=12)
    banned = sorted(set(plain[:4]))
    bias = {**{t: -100 for t in banned}, 300: 3.5, 301: -2.0}
    tokens, logits = generation_and_logits(tiny_model, prompt, n=12, logit_bias=bias)
    assert not set(tokens) & set(banned)
    for i, (token, seen) in enumerate(zip(tokens, logits)):
        assert token == int(np.argmax(adjusted(seen, prompt + tokens[:i], bias=bias, last_n=0))), i
    # sampled, at a high temperature, the banned tokens stay out too
    with context(tiny_model) as ctx:
        s = ctx.session()
        s.append(prompt)
        for seed in range(3):
            sampled = [t.id for t in s.fork().generate(12, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                                                        logit_bias={t: -100 for t in banned})]
            assert not set(sampled) & set(banned)


def test_a_second_generation_looks_back_over_the_first(tiny_model):
    """The window is the history's end when each generation starts: the first answer included."""
    prompt = text_tokens(tiny_model, 30, seed=8)
    with context(tiny_model, memo_enabled=False) as ctx:
        s = ctx.session()
        s.append(prompt)
        first = [t.id for t in s.generate(10, frequency_penalty=1.5)]
        history = s.tokens
        seen = s.logits()
        second = [t.id for t in s.generate(1, frequency_penalty=1.5)]
    assert history == prompt + first
    assert second[0] == int(np.argmax(adjusted(seen, history, frequency=1.5)))


@pytest.mark.parametrize("sampling", [{"frequency_penalty": 0.3, "presence_penalty": 0.2},
                                      {"frequency_penalty": 0.3, "temperature": 0.2, "seed": 4, "top_k": 0,
                                       "top_p": 1.0, "min_p": 0.0}], ids=["greedy", "seeded"])
def test_memo_drafts_stay_exact_with_penalties(tiny_model, sampling):
    """A drafted token is kept only if the penalized pick, made after the tokens before it were
    accepted, is that token: the same tokens as without the memo."""
    prompt = repetitive_prompt(tiny_model)
    runs = [run(tiny_model, prompt, N_GEN, {"memo_enabled": memo, "memo_gate": False}, logit_bias={7: -100}, **sampling)
            for memo in (False, True)]
    assert runs[1][0] == runs[0][0]
    assert runs[1][3].memo_tokens_skipped > 0  # drafts were confirmed under the penalties


def test_a_token_the_grammar_forces_is_taken_whatever_its_bias(words_model):  # noqa: F811
    """Decision: a finite bias changes the model's choices, not the grammar's: llama.cpp too picks
    the only token allowed, however low its logit. So skipping forced tokens stays exact."""
    prompt = word_ids(words_model, "hello world")
    ids = {words_model.token_bytes(t): t for t in range(words_model.n_vocab)}
    code, file, test = ids[b" code"], ids[b" file"], ids[b" test"]
    runs = [run(words_model, prompt, 40, {"schema_skip_enabled": skip}, grammar=FORCING,
                logit_bias={code: -100, file: -100, test: 100}, frequency_penalty=2.0) for skip in (False, True)]
    assert runs[1][:2] == runs[0][:2]
    assert re.fullmatch(r"the code test will return a value (paris|python)", runs[0][1])  # " file" banned, " test" +100
    assert runs[1][3].schema_tokens_inferred == 6 and runs[0][3].schema_tokens_inferred == 0


@pytest.mark.parametrize("schema", [{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                                     "required": ["a", "b"]}])
def test_penalties_under_a_json_schema_skip_exactly(tiny_model, schema):
    prompt = text_tokens(tiny_model, 40, seed=2)
    outputs = [run(tiny_model, prompt, 60, {"schema_skip_enabled": skip}, json_schema=schema, frequency_penalty=1.0,
                   presence_penalty=0.5, repeat_penalty=1.2)[:3] for skip in (False, True)]
    assert outputs[1] == outputs[0]


@pytest.mark.parametrize("kwargs, message", [
    ({"logit_bias": {10**6: 1.0}}, "logit_bias: token 1000000 is not a token id of this model"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias: token -1 is not a token id"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias: token '5' is not a token id"),
    ({"logit_bias": {5: float("nan")}}, "the bias of token 5 must be a finite number"),
    ({"logit_bias": [(5, 1.0)]}, "logit_bias must map token ids to biases"),
    ({"frequency_penalty": float("inf")}, "frequency_penalty must be a finite number"),
    ({"presence_penalty": "1"}, "presence_penalty must be a finite number"),
    ({"repeat_penalty": 0}, "repeat_penalty must be a finite number > 0"),
    ({"repeat_last_n": -1}, "repeat_last_n must be an integer >= 0"),
    ({"repeat_last_n": True}, "repeat_last_n must be an integer >= 0"),
])
def test_bad_values_are_refused_before_generating(tiny_context, kwargs, message):
    s = tiny_context.session()
    s.append([1, 5, 6])
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        s.generate(4, **kwargs)
    assert s.n_tokens == 3
