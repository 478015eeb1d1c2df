"""Sparse attention over tool results (Tier 2, sparse_attn_enabled) through the chat layer: the
rendered prompt's tool results found as token ranges (ChatTemplate.render_marked, token_spans,
the server's generic tool format), and Session.sync carrying them into the session as
append(kind="tool") marks them. With sparse attention off the marks change nothing: same tokens,
same work, same logits. The server's option: tests/test_serve.py. Mechanics only: quality is
benchmarks/quality.py's."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from pyllamaopt import Chat, ChatTemplate, Context, InvalidArgumentError, OptConfig
from pyllamaopt.chat import BUILTIN_TEMPLATES, token_spans
from pyllamaopt.serve.chat_messages import Tool, ToolCall, ToolChoice, ToolResult, Turn
from pyllamaopt.serve.chat_prompt import prompt_tokens, render_prompt
from pyllamaopt.serve.params import GenerateParams
from tinymodel import CHATML, WORDS

SPARSE = dict(sparse_attn_enabled=True, sparse_attn_keep_edges=16, sparse_attn_span=16)


def context(model, **config):
    return Context(model, n_ctx=4096, n_batch=256, n_seq_max=4, n_threads=2, config=OptConfig(env={}, **config))


def filler(n_words, seed, avoid=("capital", "france", "paris")):
    rng = random.Random(seed)
    return " ".join(rng.choice([w for w in WORDS if w not in avoid]) for _ in range(n_words))


def spelled(model, tokens):
    return b"".join(model.token_bytes(t, special=True) for t in tokens).decode()


def work(stats):
    """The counters (not the timings)."""
    return {k: v for k, v in stats.as_dict().items() if not k.endswith("_us")}


def test_render_marked_finds_the_marked_contents_where_the_template_put_them():
    tool = "line one\nerror: two\n"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "read it"},
                {"role": "assistant", "content": "call"}, {"role": "tool", "content": tool},
                {"role": "tool", "content": "second result"}]
    chatml = ChatTemplate(CHATML)
    text, spans = chatml.render_marked(messages, {3: [(0, len(tool))], 4: [(7, 13)]})
    assert text == chatml.render(messages)
    assert [text[a:b] for a, b in spans] == [tool, "result"]
    # a template that trims contents (Gemma 3's) and puts the system prompt into the first turn
    gemma = ChatTemplate(BUILTIN_TEMPLATES["gemma3"], bos_token="<bos>")
    turns = [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "  padded result \n"},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "padded"}]
    text, spans = gemma.render_marked(turns, {0: [(2, 11)], 1: [(0, 17)], 3: [(0, 3)]})
    assert text == gemma.render(turns)
    assert [text[a:b] for a, b in spans] == ["Be brief.", "padded result", "pad"]
    assert gemma.render_marked(turns, {}) == (text, [])


def test_a_template_that_changes_the_contents_gets_no_marks_and_the_same_text():
    template = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content | upper }}\n{% endfor %}")
    messages = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "result"}]
    assert template.render_marked(messages, {1: [(0, 6)]}) == (template.render(messages), [])
    # one that looks at the content: the placeholder renders otherwise, no marks
    looking = ChatTemplate("{% for m in messages %}{% if m.content == 'result' %}{{ m.content }}{% endif %}"
                           "{% endfor %}")
    assert looking.render_marked(messages, {1: [(0, 6)]}) == ("result", [])


def test_token_spans_are_the_tokens_wholly_inside_each_range(tiny_model):
    text = "hello world, the code file error return value paris"
    tokens = tiny_model.tokenize(text, add_bos=False, special=True)
    start = text.index(" the code")
    end = text.index(" paris")
    [(a, b)] = token_spans(tiny_model, text, tokens, [(start, end)])
    assert spelled(tiny_model, tokens[a:b]) == text[start:end]
    # a range that cuts tokens: only the whole ones inside it; one inside no token: none
    cut = token_spans(tiny_model, text, tokens, [(start + 2, end - 2), (start + 1, start + 2)])
    assert len(cut) == 1 and spelled(tiny_model, tokens[cut[0][0]:cut[0][1]]) in text[start + 2:end - 2]
    assert cut[0][0] > a and cut[0][1] < b


def test_the_generic_format_marks_each_tool_results_content(tiny_model):
    call = ToolCall("call_1", "read", '{"path":"a"}')
    second = ToolCall("call_2", "read", '{"path":"b"}')
    contents = ['first "quoted"\nline', "second result ünïcode"]
    tools = [Tool("read", None, {"type": "object", "properties": {"path": {"type": "string"}}})]
    shapes = {  # OpenAI: tool messages in a row; Anthropic: results and text in one user message
        "openai": [Turn("user", "read both"), Turn("assistant", calls=[call, second]),
                   Turn("user", results=[ToolResult("call_1", contents[0])]),
                   Turn("user", results=[ToolResult("call_2", contents[1], is_error=True)])],
        "anthropic": [Turn("user", "read both"), Turn("assistant", calls=[call, second]),
                      Turn("user", "now answer", results=[ToolResult("call_1", contents[0]),
                                                          ToolResult("call_2", contents[1], is_error=True)])],
    }
    for name, template in {"chatml": ChatTemplate(CHATML),
                           "gemma3": ChatTemplate(BUILTIN_TEMPLATES["gemma3"], bos_token="<bos>")}.items():
        for shape, turns in shapes.items():
            plain = render_prompt(template, turns, tools, ToolChoice(), GenerateParams())
            marked = render_prompt(template, turns, tools, ToolChoice(), GenerateParams(), mark_tool_results=True)
            assert marked.text == plain.text and plain.tool_results == [], (name, shape)
            escaped = [json.dumps(c, ensure_ascii=False)[1:-1] for c in contents]
            assert [marked.text[a:b] for a, b in marked.tool_results] == escaped, (name, shape)
            tokens, spans = prompt_tokens(tiny_model, marked)
            assert tokens == tiny_model.tokenize(plain.text, add_bos=False, special=True)
            assert [spelled(tiny_model, tokens[a:b]) for a, b in spans] == escaped, (name, shape)


def conversation(model):
    """A prompt with two tool results (tokens, their spans) and the question after them, and
    where in the second result the text the question names is (a span)."""
    tok = lambda text: model.tokenize(text, add_bos=False)  # noqa: E731  (each piece starts with a space)
    head = tok("the user asks about the capital of france") + tok("call read")
    first = tok(filler(260, 1))
    glue = tok("and then")
    named = tok("paris is the capital of france")
    second = tok(filler(200, 2)) + named + tok(filler(80, 3))
    tail = tok("what is the capital of france")
    tokens = head + first + glue + second + tail
    a = len(head)
    b = a + len(first) + len(glue)
    at = b + len(second) - len(named) - len(tok(filler(80, 3)))
    return tokens, [(a, a + len(first)), (b, b + len(second))], (at, at + len(named))


def test_with_sparse_attention_off_the_marks_change_nothing(tiny_model):
    tokens, spans, _ = conversation(tiny_model)
    more = tiny_model.tokenize(" and of paris", add_bos=False)
    runs = []
    for marks in ([], spans):
        with context(tiny_model) as ctx:
            s = ctx.session()
            s.sync(tokens, tool_spans=marks)
            first = s.stats
            s.sync(tokens + more, tool_spans=marks)  # the next request: exact reuse of the prefix
            runs.append((s.tokens, work(first), work(s.stats), s.logits(), s.holes, s.approx_from))
    (tokens_a, first_a, all_a, logits_a, holes_a, approx_a), (tokens_b, first_b, all_b, logits_b, holes_b, approx_b) = runs
    assert tokens_a == tokens_b and first_a == first_b and all_a == all_b
    assert np.array_equal(logits_a, logits_b)
    assert holes_a == holes_b == [] and approx_a is approx_b is None
    assert all_a["tokens_prefilled"] - first_a["tokens_prefilled"] < len(more) + 2 * ctx.block_size


def test_sync_marks_the_new_tool_results_and_scores_them_against_the_text_after_them(tiny_model):
    tokens, spans, named = conversation(tiny_model)
    with context(tiny_model, **SPARSE) as ctx:
        s = ctx.session()
        s.sync(tokens[:spans[0][0]])  # the turn before the tool results, already computed
        s.sync(tokens, tool_spans=spans)
        assert s.tokens == tokens and s.invariant_violation is None
        holes, stats = s.holes, s.stats
        assert holes and stats.sparse_tokens_dropped == sum(b - a for a, b in holes)
        for a, b in holes:  # inside a tool result, its first and last 16 tokens kept
            assert any(start + 16 <= a and b <= end - 16 for start, end in spans)
        assert all(b <= named[0] or a >= named[1] for a, b in holes)  # what the question names stays
        # both results were scored, against the question: the first one too, not against the glue
        assert any(spans[0][0] <= a < spans[0][1] for a, _ in holes)
        assert s.approx_from == holes[0][0]
        # the next request keeps the prefix (holes included) and computes only what is new
        more = tiny_model.tokenize(" and of paris", add_bos=False)
        before = s.stats
        s.sync(tokens + more, tool_spans=spans)
        assert s.holes == holes and (s.stats - before).tokens_prefilled == len(more)


def test_a_mark_cut_by_the_kept_prefix_is_appended_whole(tiny_model):
    tokens, spans, _ = conversation(tiny_model)
    with context(tiny_model, **SPARSE) as ctx:
        s = ctx.session()
        s.sync(tokens[:spans[0][0] + 40])  # a cancelled request left part of the first result
        s.sync(tokens, tool_spans=spans)
        assert s.tokens == tokens and any(spans[0][0] <= a < spans[0][1] for a, _ in s.holes)


def test_bad_tool_spans_are_refused_and_leave_the_session_unchanged(tiny_model):
    tokens, spans, _ = conversation(tiny_model)
    with context(tiny_model, **SPARSE) as ctx:
        s = ctx.session()
        s.sync(tokens[:50])
        for bad in ([spans[1], spans[0]], [(10, 10)], [(0, len(tokens) + 1)], [(5, 20), (15, 30)]):
            with pytest.raises(InvalidArgumentError, match="tool spans"):
                s.sync(tokens, tool_spans=bad)
        for bad in ([(-1, 5)], [(1, 2, 3)], [(0.5, 2)], [(True, 2)]):
            with pytest.raises(InvalidArgumentError, match="tool_spans"):
                s.sync(tokens, tool_spans=bad)
        assert s.tokens == tokens[:50] and s.holes == []


def test_chat_marks_tool_messages(tiny_model):
    template = ChatTemplate(CHATML)
    result = filler(300, 4) + " error: paris is the capital of france " + filler(100, 5)
    runs = {}
    for on in (False, True):
        with context(tiny_model, **(SPARSE if on else {})) as ctx:
            chat = Chat(ctx.session(), system="you call tools", template=template)
            chat.send("what is the capital of france", max_tokens=3)
            chat.send(result, role="tool", max_tokens=3)
            assert chat.messages[-2] == {"role": "tool", "content": result}
            s = chat.session
            prompt_tokens = tiny_model.tokenize(template.render(chat.messages[:4]), add_bos=False, special=True)
            assert s.tokens[:len(prompt_tokens)] == prompt_tokens
            runs[on] = (prompt_tokens, work(s.stats), s.holes, s.approx_from)
            if on:
                assert s.holes and s.approx_from == s.holes[0][0]
                for a, b in s.holes:  # inside the tool message's content
                    assert spelled(tiny_model, s.tokens[a:b]).strip() in result
                continue
            with context(tiny_model) as other:  # off: as a plain sync of the rendered prompt
                plain = other.session()
                for n in (2, 4):
                    plain.sync(tiny_model.tokenize(template.render(chat.messages[:n]), add_bos=False, special=True))
                    plain.generate_text(3)
                assert plain.tokens == s.tokens and work(plain.stats) == runs[False][1]
    assert runs[False][2] == [] and runs[False][3] is None
    assert runs[True][0] == runs[False][0]
    assert runs[True][1]["sparse_tokens_dropped"] > 0 == runs[False][1]["sparse_tokens_dropped"]
