"""Grammar-constrained generation on the tiny models (methods/grammar): the fast masking path
picks exactly what masking the whole vocabulary picks; tokens the grammar forces are taken
without logits and the output is token for token the one computed without skipping; bad
grammars fail before generating; dead ends and truncation are reported."""
from __future__ import annotations

import re

import pytest

from pyllamaopt import Context, GrammarError, Model, OptConfig
from tinymodel import write_tiny_llama

# on the tiny vocabulary (letters, digits, punctuation, words)
GRAMMARS = {
    "call": (r'''root ::= "{" ws "\"tool\":" ws name "," ws "\"line\":" ws [0-9]{1,3} ws "}"
name ::= "\"read\"" | "\"write\"" | "\"test\""
ws ::= [ ]?''', r'\{ ?"tool": ?"(read|write|test)", ?"line": ?[0-9]{1,3} ?\}'),
    "words": (r'''root ::= ("the" | "a") " " ("code" | "file" | "test") (" " [a-z]+){0,4} "."''',
              r'(the|a) (code|file|test)( [a-z]+){0,4}\.'),
    "list": (r'''root ::= "[" item ("," item)* "]"
item ::= [0-9]+ | "\"" [a-z]{1,8} "\""''', r'\[(?:[0-9]+|"[a-z]{1,8}")(?:,(?:[0-9]+|"[a-z]{1,8}"))*\]'),
}
PROMPTS = ["the code file has a function that will return a value", "hello world python test", "paris france capital"]


def generate(model, prompt, grammar, max_tokens=40, **config):
    """prompt: text, or token ids"""
    with Context(model, n_ctx=1024, n_batch=256, n_threads=2, config=OptConfig(env={}, **config)) as ctx:
        s = ctx.session()
        s.append_text(prompt) if isinstance(prompt, str) else s.append(prompt)
        before = s.stats
        g = s.generate(max_tokens, grammar=grammar)
        tokens = [t.id for t in g]
        return tokens, g.text, g.finish_reason, s.stats - before


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_fast_masking_picks_what_full_masking_picks(tiny_model, name):
    grammar, pattern = GRAMMARS[name]
    for prompt in PROMPTS:
        fast = generate(tiny_model, prompt, grammar)
        full = generate(tiny_model, prompt, grammar, schema_full_mask=True)
        assert fast[:3] == full[:3], prompt
        text, reason = fast[1], fast[2]
        if reason == "eos":
            assert re.fullmatch(pattern, text), text
        else:
            assert reason == "length"


def test_generations_made_before_either_runs_keep_their_own_grammars(tiny_model):
    """The session is configured for the generation that runs (sampling, grammar, budget), however
    generations made earlier ran in between: the end of a turn drops the grammar, so the next one
    sets its own again."""
    grammar, pattern = GRAMMARS["words"]
    with Context(tiny_model, n_ctx=1024, n_batch=256, n_threads=2, config=OptConfig(env={})) as ctx:
        s = ctx.session()
        s.append_text(PROMPTS[0])
        free = s.generate(3)
        constrained = s.generate(40, grammar=grammar)
        assert len(list(free)) == 3
        list(constrained)
    assert constrained.finish_reason in ("eos", "length")
    assert re.match(r"(the|a) (code|file|test)", constrained.text), constrained.text
    if constrained.finish_reason == "eos":
        assert re.fullmatch(pattern, constrained.text), constrained.text


@pytest.mark.parametrize("fit", [False, True], ids=["plain", "fit"])
def test_seeded_sampling_draws_from_what_full_masking_gives(tiny_model, fit):
    """Sampling takes the top-k allowed tokens from the model's favourites when they hold k allowed
    ones (else from every allowed token): the same candidates, so the same draws, as checking every
    token of the vocabulary (schema_full_mask), with and without the max_tokens budget."""
    for name in sorted(GRAMMARS):
        grammar = GRAMMARS[name][0]
        for seed, prompt in enumerate(PROMPTS):
            for top_k in (40, 3):
                runs = []
                for full_mask in (False, True):
                    with Context(tiny_model, n_ctx=1024, n_batch=256, n_threads=2,
                                 config=OptConfig(env={}, schema_full_mask=full_mask, schema_fit_max_tokens=fit)) as ctx:
                        s = ctx.session()
                        s.append_text(prompt)
                        g = s.generate(30, grammar=grammar, temperature=1.0, top_k=top_k, seed=seed)
                        runs.append(([t.id for t in g], g.finish_reason, s.stats.schema_budget_picks))
                assert runs[0] == runs[1], (name, prompt, top_k)


def test_seeded_sampling_under_a_grammar_is_valid_and_reproducible(tiny_model):
    grammar, pattern = GRAMMARS["call"]
    with Context(tiny_model, n_ctx=1024, n_batch=256, n_threads=2) as ctx:
        runs = []
        for _ in range(2):
            s = ctx.session()
            s.append_text(PROMPTS[0])
            g = s.generate(40, grammar=grammar, temperature=1.0, seed=5)
            runs.append(([t.id for t in g], g.text, g.finish_reason))
            s.close()
    assert runs[0] == runs[1]
    assert runs[0][2] == "length" or re.fullmatch(pattern, runs[0][1])


@pytest.fixture(scope="module")
def words_model(tmp_path_factory):
    """Whole words only (no characters, no byte fallback): a grammar can leave one token. Its
    tokenizer cannot encode arbitrary text, so prompts are given as token ids."""
    return Model(write_tiny_llama(tmp_path_factory.mktemp("words") / "words.gguf", characters=False))


def word_ids(model, text):
    ids = {model.token_bytes(t): t for t in range(model.n_vocab)}
    return [model.bos_token] + [ids[(" " + w).encode()] for w in text.split()]


FORCING = r'''root ::= "the" " code" (" file" | " test") " will" " return" " a" " value" (" paris" | " python")'''


@pytest.mark.parametrize("config", [{}, {"schema_skip_batch": True}], ids=["exact", "batch"])
def test_forced_tokens_are_skipped(words_model, config):
    reference = generate(words_model, word_ids(words_model, "hello world"), FORCING, schema_skip_enabled=False)
    skipping = generate(words_model, word_ids(words_model, "hello world"), FORCING, **config)
    assert skipping[1] == reference[1]
    assert re.fullmatch(r"the code (file|test) will return a value (paris|python)", reference[1])
    stats, ref_stats = skipping[3], reference[3]
    # the, code, will, return, a, value: forced; the two choices are the model's
    assert stats.schema_tokens_skipped == 6 and stats.schema_tokens_inferred == 6
    assert ref_stats.schema_tokens_skipped == 0 and stats.schema_tokens_total == ref_stats.schema_tokens_total
    if config:  # the forced tokens computed together with the next step: fewer passes
        assert stats.forward_passes < ref_stats.forward_passes
    else:  # one-token steps without logits: the same KV bits, the same tokens
        assert skipping[0] == reference[0]


def test_invalid_grammar_fails_before_generating(tiny_model):
    with Context(tiny_model, n_ctx=256, n_threads=2) as ctx:
        s = ctx.session()
        s.append_text("hello")
        n = s.n_tokens
        # the parser's reason is in the message (patches/0017: it went to stderr only)
        for bad, why in [('root ::= "unclosed', "unexpected end of input"), ("notroot ::= \"a\"", "root"),
                         ('root ::= missing', "Undefined rule identifier 'missing'"),
                         ('root ::= root "a"', "left recursion")]:
            with pytest.raises(GrammarError, match=why):
                s.generate(5, grammar=bad)
        # the parser's "at <the rest>" keeps 40 characters of the rest (a 2,000-rule grammar: 40 KB of error)
        long = "root ::= (r0\n" + "".join(f'r{i} ::= "x{i}"\n' for i in range(2000))
        with pytest.raises(GrammarError, match=r"expecting '\)' at ") as info:
            s.generate(5, grammar=long)
        assert len(str(info.value)) < 300, str(info.value)
        # {min,max} with min > max: llama.cpp's parser allocated without end (the process was killed)
        with pytest.raises(GrammarError, match=r"repetition \{3,1\} has its minimum above its maximum"):
            s.generate(5, grammar='root ::= "a"{3,1}')
        assert s.n_tokens == n
        assert s.generate_text(3) is not None  # the session goes on


def test_grammars_beyond_the_parsers_depth_are_refused_not_a_crash(tiny_model):
    """llama.cpp's GBNF parser recurses per nested group and the grammar analysis per chained rule:
    20,000 nested parentheses or 100,000 chained rules overflowed the stack (SIGSEGV, the whole
    process; a server with it). Refused with GrammarError; parentheses inside literals, classes and
    comments do not count; what is within the limits still works."""
    from pyllamaopt.grammar.limits import MAX_NESTING

    deep = "root ::= " + "(" * 20000 + '"a"' + ")" * 20000
    chain = "\n".join(["root ::= r0", *(f'r{i} ::= r{i + 1} | "x"' for i in range(100000)), 'r100000 ::= "y"'])
    with Context(tiny_model, n_ctx=256, n_threads=2) as ctx:
        s = ctx.session()
        s.append_text("hello")
        with pytest.raises(GrammarError, match=f"nests groups 20000 deep \\(at most {MAX_NESTING}\\)"):
            s.generate(5, grammar=deep)
        with pytest.raises(GrammarError, match=f"100001 rules|100002 rules"):
            s.generate(5, grammar=chain)
        with pytest.raises(GrammarError, match="not valid UTF-8"):
            s.generate(5, grammar='root ::= "\ud800"')
        quoted = 'root ::= "((((" [(((] ("a" | "b") # ((((\n'
        assert re.fullmatch(r"\(\(\(\(\([ab]", s.generate_text(10, grammar=quoted))
        within = "root ::= " + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING
        assert s.generate_text(3, grammar=within) == "a"


def test_dead_end_and_truncation_are_reported(words_model, tiny_model):
    # no token of the words vocabulary spells "zzz"
    _, text, reason, _ = generate(words_model, word_ids(words_model, "hello"), 'root ::= "the" "zzz"')
    assert reason == "grammar" and text == "the"
    _, text, reason, _ = generate(tiny_model, "hello", GRAMMARS["list"][0], max_tokens=3)
    assert reason == "length" and len(text) > 0


def test_json_schema_output_is_an_instance(tiny_model):
    import json

    schema = {"type": "object", "properties": {"tool": {"enum": ["read", "write"]},
                                               "line": {"type": "integer", "minimum": 1, "maximum": 999}},
              "required": ["tool", "line"], "additionalProperties": False}
    with Context(tiny_model, n_ctx=1024, n_batch=256, n_threads=2) as ctx:
        for prompt in PROMPTS:
            s = ctx.session()
            s.append_text(prompt)
            g = s.generate(40, json_schema=schema)
            text = "".join(t.text for t in g)
            assert g.finish_reason == "eos", text
            value = json.loads(text)
            assert value["tool"] in ("read", "write") and 1 <= value["line"] <= 999 and set(value) == {"tool", "line"}
            s.close()
        with pytest.raises(GrammarError):
            ctx.session().generate(5, json_schema={"type": "string", "pattern": "^(?=a)"})


def test_what_a_grammar_state_allows_is_remembered_per_vocabulary(words_model, tiny_model):
    """One grammar on two vocabularies, interleaved: the answers remembered for a grammar state
    (the single forced token, the allowed tokens) belong to one model and never stand in for the
    other's, and remembered answers pick what full masking picks."""
    runs = [(words_model, word_ids(words_model, "hello world")), (tiny_model, PROMPTS[0])]
    for _ in range(2):  # the second round answers from what the first remembered
        for model, prompt in runs:
            remembered = generate(model, prompt, FORCING)
            full = generate(model, prompt, FORCING, schema_skip_enabled=False, schema_full_mask=True)
            assert remembered[:3] == full[:3]


def test_schema_valid_is_reported(tiny_model):
    """strict=False: the grammar enforces what it can, and schema_valid says whether the output
    is valid against the whole schema (jsonschema); strict=True refuses such a schema; an exact
    schema's outputs are valid."""
    import json

    import jsonschema

    from pyllamaopt import UnenforceableSchemaError
    from pyllamaopt.grammar import compile_json_schema

    unique = {"type": "array", "items": {"enum": ["read", "write"]}, "minItems": 2, "maxItems": 3,
              "uniqueItems": True}
    exact = {"type": "object", "properties": {"tool": {"enum": ["read", "write"]}}, "required": ["tool"]}
    with Context(tiny_model, n_ctx=1024, n_batch=256, n_threads=2) as ctx:
        with pytest.raises(UnenforceableSchemaError, match="uniqueItems"):
            ctx.session().generate(5, json_schema=unique)
        compiled = compile_json_schema(unique, strict=False)
        seen = set()
        for seed, prompt in enumerate(PROMPTS * 2):
            for schema in (unique, compiled):  # a dict with strict=False, or compiled once
                s = ctx.session()
                s.append_text(prompt)
                g = s.generate(40, json_schema=schema, strict=False, temperature=1.0, seed=seed)
                assert g.schema_valid is None  # not finished yet
                for _ in g:
                    pass
                assert g.finish_reason == "eos", g.text
                value = json.loads(g.text)
                assert g.schema_valid == jsonschema.Draft202012Validator(unique).is_valid(value), g.text
                assert (g.schema_error is None) == g.schema_valid
                seen.add(g.schema_valid)
                s.close()
            s = ctx.session()
            s.append_text(prompt)
            g = s.generate(40, json_schema=exact)
            for _ in g:
                pass
            assert g.schema_valid is True and g.schema_error is None
            s.close()
        assert seen == {True, False}  # the tiny model's samples repeat an item or not: both are told apart
        s = ctx.session()
        s.append_text(PROMPTS[0])
        cut = s.generate(2, json_schema=exact)
        for _ in cut:
            pass
        assert cut.finish_reason == "length" and cut.schema_valid is False and "not one JSON value" in cut.schema_error
        plain = s.generate(2)
        for _ in plain:
            pass
        assert plain.schema_valid is None


def run(model, prompt, max_tokens, **generate_args):
    """Tokens, text, finish reason, schema_valid and budget picks of one generation, with
    schema_fit_max_tokens on (and schema skipping on as by default)."""
    with Context(model, n_ctx=1024, n_batch=256, n_threads=2,
                 config=OptConfig(env={}, schema_fit_max_tokens=True)) as ctx:
        s = ctx.session()
        s.append_text(prompt)
        g = s.generate(max_tokens, **generate_args)
        tokens = [t.id for t in g]
        return tokens, g.text, g.finish_reason, g.schema_valid, s.stats.schema_budget_picks


@pytest.mark.parametrize("name", ["list", "call"])
def test_fit_max_tokens_closes_what_would_be_cut_off(tiny_model, name):
    """schema_fit_max_tokens: at every budget the grammar's shortest completion fits, the output
    ends (eos) within it and matches the grammar; a pick differs from the model's only when the
    budget demands it, so without such a pick the output is the one generated without the budget."""
    grammar, pattern = GRAMMARS[name]
    shortest = {"list": len("[0]"), "call": len('{"tool":"read","line":0}')}[name] + 1  # + end of generation
    cut_off = changed = 0
    for prompt in PROMPTS:
        free = generate(tiny_model, prompt, grammar, max_tokens=60)
        for budget in range(shortest, 41, 3):
            tokens, text, reason, _, picks = run(tiny_model, prompt, budget, grammar=grammar)
            assert reason == "eos" and len(tokens) <= budget and re.fullmatch(pattern, text), (budget, text)
            plain = generate(tiny_model, prompt, grammar, max_tokens=budget)
            if picks == 0:
                assert (tokens, text) == plain[:2], budget
            cut_off += plain[2] == "length"
            changed += picks > 0
        tokens, text, reason, _, picks = run(tiny_model, prompt, 60, grammar=grammar)
        assert (tokens, text, reason, picks) == (free[0], free[1], free[2], 0) or free[2] == "length"
    assert cut_off > 0 and changed > 0  # the budgets above did cut outputs off without it


def test_fit_max_tokens_with_a_json_schema_and_with_sampling(tiny_model):
    import json

    schema = {"type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}},
                                               "line": {"type": "integer"}},
              "required": ["files", "line"]}
    changed = 0
    for budget in (26, 30, 36):  # the shortest instance, {"files": [], "line": 0}, and the end: 25
        for seed, prompt in enumerate(PROMPTS):
            for sampling in ({}, {"temperature": 1.0, "seed": seed}):
                tokens, text, reason, valid, picks = run(tiny_model, prompt, budget, json_schema=schema, **sampling)
                assert reason == "eos" and len(tokens) <= budget and valid is True, (budget, sampling, text)
                assert set(json.loads(text)) == {"files", "line"}
                changed += picks > 0
    assert changed > 0


def test_fit_max_tokens_is_off_by_default_and_a_budget_too_small_is_ignored(tiny_model):
    grammar = GRAMMARS["call"][0]
    assert OptConfig(env={}).schema_fit_max_tokens is False
    _, _, reason, _ = generate(tiny_model, PROMPTS[0], grammar, max_tokens=8)
    assert reason == "length"
    # the shortest call takes 25 characters: 8 tokens cannot hold it, so nothing is forced to fit
    tokens, _, reason, _, picks = run(tiny_model, PROMPTS[0], 8, grammar=grammar)
    assert reason == "length" and len(tokens) == 8 and picks == 0
