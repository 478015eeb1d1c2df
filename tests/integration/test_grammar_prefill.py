"""A grammar that takes text before the output (Session.generate's grammar_prefill), on SmolLM2 135M
Instruct: as llama.cpp's sampler feeds a chat format's tool-call grammar the template's generation
prompt before the reply (common/sampling.cpp, common_sampler_init), so that a grammar whose root
starts with the generation prompt, one that ends inside the reply's reasoning too, applies from the
reply's first token."""
from __future__ import annotations

import pytest

from pyllamaopt import ChatTemplate, Context, GrammarError, InvalidArgumentError, Model, OptConfig
from pyllamaopt.serve.chat_messages import Tool, ToolChoice, Turn
from pyllamaopt.serve.chat_prompt import render_prompt
from pyllamaopt.serve.params import GenerateParams
from test_native_tool_choice import native_templates
from upstream_programs import templates_dir

pytestmark = pytest.mark.integration

GENERATION_PROMPT = "<|im_start|>assistant\n<think>\n"
RULES = '\nreasoning ::= [A-Za-z ,.]{1,60}\nanswer ::= "{" [a-z ]{1,20} "}"'
# the root starts with the generation prompt, which ends inside the optional reasoning
WHOLE = 'root ::= "<|im_start|>assistant\\n" ("<think>\\n" reasoning "</think>\\n")? answer' + RULES
REST = 'root ::= reasoning "</think>\\n" answer' + RULES  # what is left of it after the generation prompt

@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> Model:
    return Model(smollm2_path)


def generate(model: Model, config: dict | None = None, **kwargs) -> tuple[list[int], str, str]:
    with Context(model, n_ctx=512, n_threads=2, config=OptConfig(env={}, **(config or {}))) as ctx:
        s = ctx.session()
        s.append(model.tokenize(ChatTemplate.for_model(model).render(
            [{"role": "user", "content": "Is Paris the capital of France?"}]), add_bos=False, special=True))
        g = s.generate(48, **kwargs)
        tokens = [t.id for t in g]
        return tokens, g.text, g.finish_reason


@pytest.mark.parametrize("config", [{}, {"schema_skip_enabled": False}, {"schema_fit_max_tokens": True}],
                         ids=["skip", "no-skip", "fit"])
def test_a_prefilled_grammar_goes_on_from_where_the_prefill_left_it(smollm2, config):
    """The whole grammar (its root starts with the generation prompt, which ends inside the optional
    reasoning) with the generation prompt prefilled gives the tokens of the grammar of what is left."""
    prefilled = generate(smollm2, config, grammar=WHOLE, grammar_prefill=GENERATION_PROMPT)
    rest = generate(smollm2, config, grammar=REST)
    assert prefilled == rest and prefilled[2] == "eos", prefilled
    assert "</think>\n{" in prefilled[1] and prefilled[1].endswith("}"), prefilled[1]
    assert generate(smollm2, config, grammar=WHOLE)[0] != prefilled[0]  # (without: the generation prompt again)


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_every_native_required_grammar_takes_its_generation_prompt_in_the_engine(smollm2, thinking):
    """The pinned tree's templates with native tools, a call required: the engine's grammar takes the
    generation prompt's tokens (SmolLM2's tokenizer) where the server prefills it."""
    turns = [Turn("user", "What is the weather in Paris?")]
    tool = Tool("get_weather", "The weather in a city", {"type": "object", "properties": {"city": {"type": "string"}}})
    prefilled = []
    with Context(smollm2, n_ctx=256, n_threads=2) as ctx:
        s = ctx.session()
        s.append_text("Hi")
        for name in native_templates():
            prompt = render_prompt(ChatTemplate.from_file(templates_dir() / name), turns, [tool], ToolChoice("required"),
                                   GenerateParams(), template_kwargs={"enable_thinking": thinking})
            s.generate(1, grammar=prompt.reply_grammar, grammar_prefill=prompt.reply_prefill).close()
            prefilled += [name] if prompt.reply_prefill else []
    assert "Qwen-QwQ-32B.jinja" in prefilled and len(prefilled) >= 15, prefilled


def test_a_prefill_the_grammar_does_not_take_is_refused(smollm2):
    with Context(smollm2, n_ctx=256, n_threads=2) as ctx:
        s = ctx.session()
        s.append_text("Hi")
        with pytest.raises(GrammarError, match="prefill"):
            s.generate(4, grammar='root ::= "<|im_start|>user\\n" [a-z]+', grammar_prefill="<|im_start|>assistant\n")
        for bad in ({"grammar_prefill": "a"},
                    {"grammar": 'root ::= "ab"', "grammar_triggers": [("word", "a")], "grammar_prefill": "a"},
                    {"grammar": 'root ::= "ab"', "grammar_prefill": 3}):
            with pytest.raises(InvalidArgumentError, match="grammar_prefill"):
                s.generate(4, **bad)
        assert s.generate_text(4, grammar='root ::= "ab"', grammar_prefill="a") == "b"  # the session goes on
