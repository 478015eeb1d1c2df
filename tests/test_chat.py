"""Chat templates (jinja2) and the Chat conversation helper."""
from __future__ import annotations

import pytest

from pyllamaopt import Chat, ChatTemplate, ChatTemplateError
from pyllamaopt.chat import BUILTIN_TEMPLATES

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
