"""Chat templates (llama.cpp's jinja engine, through ChatTemplate) and the Chat conversation helper."""
from __future__ import annotations

import os

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pyllamaopt import Chat, ChatTemplate, ChatTemplateError, ContextOverflowError, InvalidArgumentError, Model
from pyllamaopt.chat import BUILTIN_TEMPLATES, prompt_tokens
from tinymodel import CHATML

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


def test_builtin_gemma_template():
    template = ChatTemplate(BUILTIN_TEMPLATES["gemma3"], bos_token="<bos>")
    assert template.render(MESSAGES) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n")
    assert not template.render(MESSAGES[:2], add_generation_prompt=False).endswith("<start_of_turn>model\n")


def test_template_errors_are_typed():
    with pytest.raises(ChatTemplateError, match="alternate"):
        ChatTemplate(BUILTIN_TEMPLATES["gemma3"]).render([{"role": "user", "content": "a"}] * 2)
    with pytest.raises(ChatTemplateError, match="invalid chat template"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="message 0"):
        ChatTemplate("{{ messages }}").render([{"role": "user"}])


def test_templates_run_sandboxed():
    template = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        template.render(MESSAGES)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<s>", "</s>", "<unk>", "<", "s", ">", "/", " ", "the", "\n", "\ud800"]), max_size=12)
       .map("".join))
def test_has_special_text_is_whether_parsing_special_tokens_changes_the_tokens(tiny_model, text):
    """The tiny vocabulary's special tokens: <s>, </s> (control), <unk> (unknown)."""
    differs = tiny_model.tokenize(text, add_bos=False, special=True) != tiny_model.tokenize(text, add_bos=False)
    event(f"differs: {differs}")
    assert tiny_model.has_special_text(text) is differs
    assert tiny_model.has_special_text(text) is differs  # the remembered answer: the same


def test_a_conversation_checks_each_message_for_special_text_once(tiny_model):
    """A chat re-sends its earlier messages every turn: their contents are tokenized for the
    special-text check once (remembered), the prompt's tokens those a model that remembers
    nothing yet gives (the assistant's contents hold special text: tokenized apart, as text)."""
    template = ChatTemplate(CHATML)
    memo = tiny_model._special_text_memo
    messages = [{"role": "system", "content": "be brief. the code file has a function"}]
    for turn in range(4):
        messages += [{"role": "user", "content": f"turn {turn}: what does the function return"},
                     {"role": "assistant", "content": f"a value </s><s> and {turn} more"}]  # special text
        text = template.render(messages)
        misses = memo.cache_info().misses
        tokens = prompt_tokens(tiny_model, template, messages, text, add_generation_prompt=True)
        assert memo.cache_info().misses - misses == (3 if turn == 0 else 2)  # the new messages only
        assert tokens == prompt_tokens(Model(tiny_model.path), template, messages, text, add_generation_prompt=True)


def test_model_without_template(tiny_context):
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Chat(tiny_context.session())


def test_conversation_reuses_the_previous_turns(tiny_context):
    template = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                            "{% if add_generation_prompt %}assistant:{% endif %}")
    system = "be brief. " + " ".join(["the code file has a function that will return a value"] * 20)
    chat = Chat(tiny_context.session(), system=system, template=template)
    first = chat.send("hello world", max_tokens=6)
    assert chat.messages[-1] == {"role": "assistant", "content": first}
    before = chat.session.stats
    chat.send("the code", max_tokens=6)
    spent = chat.session.stats - before
    assert len(chat.messages) == 5
    block = tiny_context.block_size
    assert spent.diff_tokens_unchanged >= 3 * block  # the earlier turns were not computed again
    assert spent.tokens_prefilled < chat.session.n_tokens - 3 * block


def test_a_turn_that_cannot_start_leaves_the_conversation_as_it_was(tiny_context):
    """A message that does not fit the context, or a bad argument, fails its turn and leaves no
    message behind (it stayed, without a reply, and every later turn failed: roles must alternate)."""
    template = ChatTemplate("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
                            "{{ raise_exception('roles must alternate') }}{% endif %}{{ m.role }}: {{ m.content }}\n"
                            "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    chat = Chat(tiny_context.session(), template=template)
    chat.send("hello world", max_tokens=4)
    before = list(chat.messages)
    with pytest.raises(ContextOverflowError):
        chat.send("the code " * 2000, max_tokens=4)
    assert chat.messages == before
    with pytest.raises(InvalidArgumentError):
        chat.send("the code", max_tokens=4, temperature=-1)
    assert chat.messages == before
    reply = chat.send("the code", max_tokens=4)
    assert chat.messages == [*before, {"role": "user", "content": "the code"}, {"role": "assistant", "content": reply}]
    running = chat.stream("a test", max_tokens=8)
    partial = next(running).text
    later = chat.send("the file", max_tokens=4)  # the reply in progress ends first, and joins the messages
    assert running.finish_reason == "interrupted" and list(running) == []
    assert [m["role"] for m in chat.messages[-4:]] == ["user", "assistant", "user", "assistant"]
    assert chat.messages[-3]["content"] == partial and chat.messages[-1]["content"] == later


# --- hostile templates (issue 20): a template comes with the model file, so it may be anyone's ----

CANARY_SECRET = "pyllamaopt-sandbox-canary-7f3a"

# The classic escapes out of a jinja2 template (server-side template injection): each reaches
# Python objects through dunder attributes, a global's function attributes or str.format.
ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.environ }}",
    "{{ joiner.__init__.__globals__.os.popen('id').read() }}",
    "{{ namespace.__init__.__globals__.os.environ }}",
    "{{ lipsum.__globals__['os'].environ }}",
    "{{ lipsum.__globals__.__builtins__.__import__('os').environ }}",
    "{{ self.__init__.__globals__.__builtins__ }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.environ }}",
    "{{ raise_exception.__globals__.os.environ }}",
    "{{ strftime_now.__globals__.os.environ }}",
    "{{ (messages|attr('__class__')).__mro__[1].__subclasses__() }}",
    "{{ messages|attr('\\x5f\\x5fclass\\x5f\\x5f') }}",
    "{{ '{0.__class__.__mro__[1].__subclasses__}'.format(messages) }}",
    "{{ '{0.__init__.__globals__[os].environ}'.format(cycler) }}",
    "{{ messages.append('x') }}{{ messages.pop() }}",
    "{% set d = {} %}{{ d.update({'a': 1}) }}",
    "{{ range.__self__.__import__('os').environ }}",
    "{{ dict(a=1).__class__.__init__.__globals__ }}",
    "{{ loop.__class__ }}{% for x in [1] %}{{ loop.__class__.__init__.__globals__ }}{% endfor %}",
]


def render_hostile(source: str, messages: list) -> str | None:
    """Renders a hostile template: a string, or None for a ChatTemplateError; anything else fails."""
    try:
        return ChatTemplate(source).render(messages)
    except ChatTemplateError:
        return None


@pytest.mark.parametrize("source", ESCAPES)
def test_sandbox_escapes_are_refused_with_a_typed_error(source, monkeypatch):
    monkeypatch.setenv("PYLLAMAOPT_CANARY", CANARY_SECRET)
    messages = [{"role": "user", "content": "hi"}]
    out = render_hostile(source, messages)
    assert out is None or (CANARY_SECRET not in out and "<class" not in out), out
    assert messages == [{"role": "user", "content": "hi"}]


# (arithmetic on values of the wrong types and a filter given a value it cannot take: errors in
# llama.cpp's jinja engine as in jinja2; where the engines differ, test_llama_cpps_engine_computes_...)
@pytest.mark.parametrize("source", ["{{ 1 - 'a' }}", "{{ 5 | sort }}", "{{ 'a' | wordwrap(0) }}",
                                    "{{ strftime_now(5) }}", "{{ range(10**9) | list }}", "{{ x | tojson }}",
                                    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "{{" * 3000,
                                    "{{ 'x' * 10**10 }}", "{{ [0] * 10**10 }}", "{{ 10 ** 1000000000 }}",
                                    "{{ 'x'.center(10**10) }}", "{{ 'x'.zfill(width=10**10) }}"])
def test_any_failure_of_a_template_is_a_typed_error(source):
    """A template's own bugs (some only reached by certain messages, as a server's requests can)
    and values too large to build: ChatTemplateError, never another exception or the machine's memory."""
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


def test_llama_cpps_engine_computes_what_jinja2_refused():
    """Templates render as llama-server renders them (issue 44), through llama.cpp's jinja engine, which
    computes some expressions jinja2 raised for (docs/serve.md): division by zero is inf, and a list of
    numbers and strings sorts (a number and a string compared as text). Sorting booleans is its error
    where jinja2 sorted them."""
    messages = [{"role": "user", "content": "hi"}]
    assert ChatTemplate("{{ 1/0 }}|{{ -1/0 }}").render(messages) == "inf|-inf"
    assert ChatTemplate("{{ [10, 'a', 9] | sort | join(',') }}").render(messages) == "9,10,a"
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ [true, false] | sort }}").render(messages)


_ROOTS = ["messages", "messages[0]", "messages[0].content", "''", "'abc'", "1", "[]", "{}", "cycler", "joiner",
          "namespace", "lipsum", "range", "dict", "self", "raise_exception", "strftime_now", "bos_token",
          "namespace(a=1)", "loop", "x", "(1, 2)", "true", "none"]
_STEPS = [".__class__", ".__mro__", ".__mro__[1]", ".__subclasses__()", ".__globals__", ".__init__",
          ".__builtins__", ".__dict__", ".mro()", "['__class__']", "|attr('__class__')", "|attr('__globals__')",
          ".__getattribute__('__class__')", ".__reduce_ex__(2)", ".gi_frame", ".f_back", ".f_globals", ".os",
          ".environ", "['os']", ".__import__('os')", ".popen('echo " + CANARY_SECRET + "')", ".read()",
          ".append(1)", ".update({'a': 1})", ".pop()", ".clear()", ".format('{0.__class__}')",
          ".format_map({})", "|map(attribute='__class__')|list", "|selectattr('__class__')|list", ".items()",
          ".keys()", "[0]", ".__code__", ".co_consts", ".__self__", ".__func__", ".__closure__", ".environment",
          ".globals", "()", "|string", "|list", "|tojson", "|length", "|first", "|join(',')", ".__len__()",
          ".__str__()", ".__format__('')", "|sort", "|sum", " * 3", " ~ 'x'", " + 1", "|int", ".upper()",
          ".split(',')", "[1:]", "|items", ".get('os')", "|dictsort"]


@st.composite
def hostile_templates(draw):
    expression = draw(st.sampled_from(_ROOTS)) + "".join(draw(st.lists(st.sampled_from(_STEPS), max_size=6)))
    return draw(st.sampled_from([
        "{{ %s }}", "{%% set v = %s %%}{{ v }}", "{%% for v in %s %%}{{ v }}{%% endfor %%}",
        "{%% if %s %%}yes{%% endif %%}", "{{ (%s)|string }}"])) % expression


@given(hostile_templates(), st.text(max_size=20))
@settings(deadline=None)
@pytest.mark.filterwarnings("ignore::SyntaxWarning")  # jinja2 compiling `1[0]` and the like: meant
def test_random_hostile_templates_give_text_or_a_typed_error(source, content):
    """Expressions chained from the pieces of known escapes (tools/fuzz.sh: at volume): the output
    or ChatTemplateError, never another exception, never the environment, never a command run,
    and the messages are never changed."""
    os.environ["PYLLAMAOPT_CANARY"] = CANARY_SECRET  # (hypothesis runs many examples per fixture)
    try:
        messages = [{"role": "user", "content": content}]
        out = render_hostile(source, messages)
    finally:
        del os.environ["PYLLAMAOPT_CANARY"]
    event("ChatTemplateError" if out is None else "text")
    assert out is None or CANARY_SECRET not in out, (source, out)
    assert messages == [{"role": "user", "content": content}]
