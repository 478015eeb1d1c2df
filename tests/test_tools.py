"""Tool calling's generic format (pyllamaopt/serve/chat_prompt.py, reply_grammar.py,
reply_parser.py), without a model: the reply's grammar
admits calls and answers as tool_choice says, the parser reads any reply the grammar admits
however it is split into pieces, and a reply rendered back into the history is the very text
the model wrote (so the next request's prompt extends the previous prompt and answer)."""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbnf_check import parse_gbnf
from pyllamaopt import ChatTemplate
from pyllamaopt.chat import BUILTIN_TEMPLATES
from pyllamaopt.serve.chat_messages import Tool, ToolCall, ToolChoice, ToolResult, Turn, arguments_text
from pyllamaopt.serve.chat_prompt import render_prompt
from pyllamaopt.serve.errors import BadRequest
from pyllamaopt.serve.params import GenerateParams
from pyllamaopt.serve.reply_grammar import reply_grammar
from pyllamaopt.serve.reply_parser import ArgumentsPiece, CallEnd, CallStart, ReplyParser, TextPiece
from tinymodel import CHATML

TEMPLATES = {"gemma3": ChatTemplate(BUILTIN_TEMPLATES["gemma3"], bos_token="<bos>"), "chatml": ChatTemplate(CHATML)}

WEATHER = Tool("get_weather", "Current weather in a city", {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]})
# as pydantic writes it: local references to its own $defs
MOVE = Tool("move", None, {
    "properties": {"to": {"$ref": "#/$defs/Point"}, "path": {"type": "array", "items": {"$ref": "#/$defs/Point"},
                                                             "maxItems": 2}},
    "required": ["to"], "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                                            "y": {"type": "integer"}},
                                            "required": ["x", "y"]}}})
TOOLS = [WEATHER, MOVE]
CALL = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}'
TWO_CALLS = ('{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}},'
             '{"name":"move","arguments":{"to":{"x":1,"y":-2},"path":[{"x":0,"y":0}]}}]}')
ANSWER = '{"response":"It is \\"sunny\\".\\nDone."}'


def grammar(choice: ToolChoice, tools: list[Tool] = TOOLS):
    return parse_gbnf(reply_grammar(tools, choice))


@pytest.mark.parametrize("choice, admitted", [
    (ToolChoice("auto"), {CALL, TWO_CALLS, ANSWER}),
    (ToolChoice("required"), {CALL, TWO_CALLS}),
    (ToolChoice("required", parallel=False), {CALL}),
    (ToolChoice("required", "get_weather"), {CALL}),
    (ToolChoice("none"), {ANSWER}),
])
def test_the_reply_grammar_admits_what_tool_choice_allows(choice, admitted):
    g = grammar(choice)
    for text in (CALL, TWO_CALLS, ANSWER):
        assert g.matches(text) == (text in admitted), text
    # never: unknown tools, arguments off the schema, other spellings, an empty list
    for text in ('{"tool_calls":[{"name":"rm","arguments":{}}]}',
                 '{"tool_calls":[{"name":"get_weather","arguments":{"town":"Paris"}}]}',
                 '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris","unit":"kelvin"}}]}',
                 '{"tool_calls":[{"name":"get_weather","arguments":{"city":"a city far too long"}}]}',
                 '{"tool_calls":[{"name":"move","arguments":{"to":{"x":1}}}]}',
                 '{"tool_calls": [{"name":"get_weather","arguments":{"city":"Paris"}}]}',
                 '{"tool_calls":[]}', '{"response":1}', "Paris"):
        assert not g.matches(text), text


def test_tool_choice_and_schemas_that_cannot_be_served_are_bad_requests():
    with pytest.raises(BadRequest, match="'rm', which is not among the tools"):
        reply_grammar(TOOLS, ToolChoice("required", "rm"))
    bad = Tool("grep", None, {"type": "object", "properties": {"pattern": {"type": "string", "pattern": "^(?=a)a+$"}}})
    for choice in (ToolChoice(), ToolChoice("none"), ToolChoice("required", "get_weather")):  # called or not
        with pytest.raises(BadRequest, match=r"tools\[1\] \(grep\): its parameters cannot be used: "
                                             r".*#/properties/pattern"):
            reply_grammar([WEATHER, bad], choice)
    template, params = TEMPLATES["chatml"], GenerateParams()
    user = [Turn("user", "hi")]
    for tools, choice, message in (
            ([WEATHER, WEATHER], ToolChoice(), "two tools are named 'get_weather'"),
            ([Tool("", None, {})], ToolChoice(), "non-empty 'name'"),
            ([Tool("f", None, {"type": "string"})], ToolChoice(), r"tools\[0\] \(f\): the parameters must be an object"),
            ([], ToolChoice("required"), "has no tools"),
            ([], ToolChoice("required", "f"), "names the function 'f', but the request has no tools")):
        with pytest.raises(BadRequest, match=message):
            render_prompt(template, user, tools, choice, params)
    with pytest.raises(BadRequest, match="response_format cannot be combined with tools"):
        render_prompt(template, user, TOOLS, ToolChoice(), GenerateParams(json_schema={"type": "object"}))


def test_arguments_are_taken_verbatim_when_compact_and_must_be_a_json_object():
    assert arguments_text('{"b":1,"a":"x y"}', "args") == '{"b":1,"a":"x y"}'
    assert arguments_text('{"b":"\\u00e9"}', "args") == '{"b":"\\u00e9"}'  # the model's own escapes kept
    assert arguments_text('{"b": 1, "a": [1, 2]}', "args") == '{"b":1,"a":[1,2]}'  # key order kept
    assert arguments_text({"b": 1, "a": "é"}, "args") == '{"b":1,"a":"é"}'
    with pytest.raises(BadRequest, match="args is not JSON"):
        arguments_text('{"city": Paris}', "args")
    with pytest.raises(BadRequest, match="args must be a JSON object"):
        arguments_text("[1]", "args")


def parse(text: str, cuts: list[int]) -> tuple[ReplyParser, list]:
    parser, pieces, at = ReplyParser(True, "call_"), [], 0
    for cut in sorted(cuts) + [len(text)]:
        pieces += parser.feed(text[at:cut])
        at = max(at, cut)
    return parser, pieces


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_any_reply_the_grammar_admits_parses_the_same_in_any_pieces_and_renders_back_to_itself(seed, data):
    g = grammar(ToolChoice("auto"))
    text = g.sample(random.Random(seed))
    value = json.loads(text)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    whole, _ = parse(text, [])
    parser, pieces = parse(text, cuts)
    assert parser.complete and [(c.name, c.arguments) for c in parser.calls] == [(c.name, c.arguments)
                                                                                 for c in whole.calls]
    calls = value.get("tool_calls", [])
    repeat = next((i for i, c in enumerate(calls) if c in calls[:i]), None)  # the reply ends before it
    assert parser.repeated == (repeat is not None)
    assert parser.text == whole.text == value.get("response", "")
    # the pieces say the same as the end result
    assert "".join(p.text for p in pieces if isinstance(p, TextPiece)) == parser.text
    for i, call in enumerate(parser.calls):
        assert [p.name for p in pieces if isinstance(p, CallStart) and p.index == i] == [call.name]
        assert "".join(p.text for p in pieces if isinstance(p, ArgumentsPiece) and p.index == i) == call.arguments
        assert sum(isinstance(p, CallEnd) and p.index == i for p in pieces) == 1
    assert [json.loads(c.arguments) for c in parser.calls] == [c["arguments"] for c in calls[:repeat]]
    # rendered back as the assistant's turn: the text itself (for an answer: when its escapes are
    # json.dumps's, as a model's nearly always are)
    rendered = render_reply(parser)
    if repeat is None and ("tool_calls" in value or json.dumps(value, separators=(",", ":"), ensure_ascii=False) == text):
        assert rendered == text


def render_reply(parser: ReplyParser) -> str:
    """The assistant message's content as the history renders it."""
    turns = [Turn("user", "q"), Turn("assistant", parser.text, parser.calls)]
    return render_prompt(ChatTemplate("{{ messages[-1]['content'] }}"), turns, TOOLS, ToolChoice(), GenerateParams()).text


def test_a_cut_reply_keeps_what_came_and_is_not_complete():
    parser, _ = parse(TWO_CALLS[:-30], [5, 40])
    assert not parser.complete
    assert [c.name for c in parser.calls] == ["get_weather", "move"]
    assert parser.calls[0].arguments == '{"city":"Oslo","unit":"celsius"}'
    assert parser.calls[1].arguments == '{"to":{"x":1,"y":'
    parser, _ = parse(ANSWER[:20], [14, 15])  # cut inside an escape: the escape waits
    assert parser.text == 'It is ' and not parser.complete and not parser.calls
    parser, _ = parse('{"response":"\\ud83d\\ude00!"}', [19, 22, 26])
    assert parser.text == "😀!" and parser.complete
    parser = ReplyParser(False, "call_")  # without tools: all text
    assert parser.feed(CALL) == [TextPiece(CALL)] and parser.text == CALL and not parser.calls


def test_a_repeated_call_ends_the_reply_and_is_never_sent():
    """A small model repeats its call until max_tokens (SmolLM2: 116 times): the first repeat ends
    the reply, and none of its pieces was passed on, however the text is cut."""
    first = '{"name":"get_weather","arguments":{"city":"Oslo"}}'
    close = '{"name":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}}'  # an earlier call's text, longer
    text = '{"tool_calls":[' + ",".join([first, close, first, first]) + "]}"
    for cuts in ([], list(range(len(text))), [30, 31, 90, 120]):
        parser, pieces = parse(text, cuts)
        assert parser.repeated and parser.complete
        assert [c.arguments for c in parser.calls] == ['{"city":"Oslo"}', '{"city":"Oslo","unit":"celsius"}']
        assert {p.index for p in pieces if not isinstance(p, TextPiece)} == {0, 1}
        assert "".join(p.text for p in pieces if isinstance(p, ArgumentsPiece) and p.index == 1) == parser.calls[1].arguments
        assert parser.feed(first) == [] and len(parser.calls) == 2  # nothing after the end
    # a call that diverges late is passed on whole; one cut while it still looked like a repeat is
    # held until finish() gives its pieces
    parser, pieces = parse('{"tool_calls":[' + first + "," + close + "]}", list(range(40)))
    assert not parser.repeated and parser.complete and [p.index for p in pieces if isinstance(p, CallEnd)] == [0, 1]
    parser, pieces = parse('{"tool_calls":[' + first + "," + first[:-4], [])
    assert {p.index for p in pieces if not isinstance(p, TextPiece)} == {0} and len(parser.calls) == 2
    held = parser.finish()
    assert [type(p) for p in held] == [CallStart, ArgumentsPiece] and held[1].text == '{"city":"Osl'
    assert parser.finish() == [] and not parser.repeated and not parser.complete
    # cut by max_tokens just before the repeat's closing brace: its arguments are whole, it is the repeat
    parser, pieces = parse('{"tool_calls":[' + first + "," + first[:-1], [])
    assert parser.finish() == [] and parser.repeated and parser.complete and len(parser.calls) == 1


def test_stop_strings_apply_to_the_answers_decoded_text_not_to_the_json():
    """A stop string of a tool reply matched the JSON's text: a newline never (JSON writes it as an
    escape), text inside a call's arguments always. Now: the answer's decoded text only, an end of it
    that may still become a stop string held back until it does not, however the text is cut."""
    text = '{"response":"Line one.\\nLine two, STOP here."}'
    for cuts in ([], list(range(len(text))), [14, 24, 25]):
        for stop, expected, found in ((["\n"], "Line one.", "\n"), (["STOP", "two"], "Line one.\nLine ", "two"),
                                      (["STOPPED"], "Line one.\nLine two, STOP here.", None)):
            parser = ReplyParser(True, "call_", stop)
            pieces = [p for at, end in zip([0] + cuts, cuts + [len(text)]) for p in parser.feed(text[at:end])]
            pieces += parser.finish()
            assert parser.text == expected == "".join(p.text for p in pieces), (stop, cuts)
            assert parser.stop_string == found and parser.complete == (found is None)
    with pytest.raises(BadRequest, match="stop must be a non-empty string"):  # as without tools
        render_prompt(ChatTemplate("{{ messages[-1]['content'] }}"), [Turn("user", "q")], TOOLS, ToolChoice(),
               GenerateParams(stop=[""]))
    calls = ReplyParser(True, "call_", ["Paris"])  # not in arguments
    calls.feed(CALL)
    assert calls.complete and calls.stop_string is None and calls.calls[0].arguments == '{"city":"Paris"}'


@pytest.mark.parametrize("name", ["gemma3", "chatml"])
def test_the_next_request_extends_the_previous_prompt_and_answer(name):
    """The whole point: turn 2's prompt text starts with turn 1's prompt and the model's reply."""
    template = TEMPLATES[name]
    history = [Turn("system", "Be brief."), Turn("user", "Weather in Paris? And move to 1,-2.")]
    first = render_prompt(template, history, TOOLS, ToolChoice("required"), GenerateParams())
    reply, _ = parse(TWO_CALLS, [7, 33, 90])
    history += [Turn("assistant", "", reply.calls),
                Turn("user", results=[ToolResult(reply.calls[0].id, "Sunny, 21 °C")]),
                Turn("user", results=[ToolResult(reply.calls[1].id, "cannot move", is_error=True)]),
                Turn("user", "Thanks. Anything else?")]
    params = GenerateParams()
    second = render_prompt(template, history, TOOLS, ToolChoice("auto"), params)
    assert second.text.startswith(first.text + TWO_CALLS)
    # the two results and the user's text are one user message (Gemma's roles must alternate)
    assert ('{"tool_results":[{"name":"get_weather","content":"Sunny, 21 °C"},'
            '{"name":"move","content":"cannot move","is_error":true}]}\n\nThanks. Anything else?') in second.text
    # the tools are in the system message, the same whatever tool_choice says
    assert first.text.count('{"name":"get_weather","description":"Current weather in a city"') == 1
    assert render_prompt(template, history[:2], TOOLS, ToolChoice("none"), GenerateParams()).text == first.text
    # an answer in text comes back as the JSON the model wrote
    reply, _ = parse(ANSWER, [20])
    third = render_prompt(template, history + [Turn("assistant", reply.text), Turn("user", "ok")], TOOLS, ToolChoice(),
                   GenerateParams())
    assert third.text.startswith(second.text + ANSWER)
    assert second.generate_params(params, "call_").grammar is not None and second.generic
    assert params.grammar is None  # rendering changes nothing of the request


def test_a_history_with_calls_renders_without_tools_too_but_results_need_their_call():
    template = TEMPLATES["chatml"]
    call = ToolCall("call_1", "get_weather", '{"city":"Oslo"}')
    turns = [Turn("user", "q"), Turn("assistant", "Let me look.", [call]),
             Turn("user", results=[ToolResult("call_1", "Rain")]), Turn("assistant", "Rain.")]
    params = GenerateParams()
    out = render_prompt(template, turns, [], ToolChoice(), params)
    assert not out.generic and out.generate_params(params, "call_").grammar is None
    assert ('<|im_start|>assistant\nLet me look.\n{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}'
            '<|im_end|>\n<|im_start|>user\n{"tool_results":[{"name":"get_weather","content":"Rain"}]}<|im_end|>\n'
            '<|im_start|>assistant\nRain.<|im_end|>') in out.text
    with pytest.raises(BadRequest, match=r"messages\[1\]: a tool result for call 'call_9', but no earlier"):
        render_prompt(template, [Turn("user", "q"), Turn("user", results=[ToolResult("call_9", "x")])], TOOLS, ToolChoice(),
               GenerateParams())


def test_a_template_that_takes_tools_gets_them():
    source = ("{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
              "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    template = ChatTemplate(source)
    assert template.takes_tools and not TEMPLATES["chatml"].takes_tools and not TEMPLATES["gemma3"].takes_tools
    text = render_prompt(template, [Turn("user", "hi")], TOOLS, ToolChoice(), GenerateParams()).text
    assert text.startswith("<tools>get_weather;move;</tools>[system]Reply with one JSON object")
    assert '"description"' not in text  # not listed twice


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_last_assistant_message_is_continued_when_asked(name):
    """Anthropic's prefill: the prompt ends with the last assistant message's text, its turn left
    open (no end of turn, no new turn); an empty one is a new turn; what cannot be continued is a 400."""
    template = TEMPLATES[name]
    turns = [Turn("user", "Say hello"), Turn("assistant", "Hel")]
    text = render_prompt(template, turns, [], ToolChoice(), GenerateParams(), continue_last=True).text
    for prefill in ("Hel", "|", ">", "<", "_of"):  # the last three also spell parts of the turn's end
        continued = render_prompt(template, [turns[0], Turn("assistant", prefill)], [], ToolChoice(), GenerateParams(),
                           continue_last=True).text
        closed = template.render([{"role": "user", "content": "Say hello"}, {"role": "assistant", "content": prefill}],
                                 add_generation_prompt=False)
        assert continued.endswith(prefill) and closed.startswith(continued), (prefill, continued)
        assert closed[len(continued):].lstrip().startswith(("<|im_end|>", "<end_of_turn>")), (prefill, continued)
    fresh = render_prompt(template, turns[:1], [], ToolChoice(), GenerateParams(), continue_last=True).text
    assert render_prompt(template, [*turns[:1], Turn("assistant", "")], [], ToolChoice(), GenerateParams(),
                  continue_last=True).text == fresh
    assert render_prompt(template, turns, [], ToolChoice(), GenerateParams()).text != text  # OpenAI: a new turn
    with pytest.raises(BadRequest, match="trailing whitespace"):
        render_prompt(template, [turns[0], Turn("assistant", "Hel ")], [], ToolChoice(), GenerateParams(), continue_last=True)
    with pytest.raises(BadRequest, match="cannot be combined with tools"):
        render_prompt(template, turns, [WEATHER], ToolChoice(), GenerateParams(), continue_last=True)
    call = Turn("assistant", "", [ToolCall("toolu_1", "get_weather", '{"city":"Oslo"}')])
    with pytest.raises(BadRequest, match="send its result"):
        render_prompt(template, [turns[0], call], [WEATHER], ToolChoice(), GenerateParams(), continue_last=True)


def test_a_model_without_a_template_is_a_bad_request_with_tool_results_marked_too():
    """--sparse-tool-results renders with marks: a model without a chat template is the same 400
    as without the option (it was an AttributeError, a 500)."""
    from pyllamaopt.serve.app import NoChatTemplate as _NoTemplate

    for marked in (False, True):
        with pytest.raises(BadRequest, match="no chat template here"):
            render_prompt(_NoTemplate("no chat template here"), [Turn("user", "hi")], [], ToolChoice(), GenerateParams(),
                   mark_tool_results=marked)
