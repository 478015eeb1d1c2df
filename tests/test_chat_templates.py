"""Chat templates through llama.cpp's chat layer (cpp/chat, pyllamaopt.chat.ChatTemplate): from a
string, a file or a model; a template that does not parse, or raises for a conversation, is a
ChatTemplateError naming the template and the line (a 400 from the server, or a message at its
start for --chat-template-file), never a crash."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pyllamaopt import ChatTemplate, ChatTemplateError, Model
from test_serve import N_CTX, free_port, start_server, stop_server
from tinymodel import CHATML, write_tiny_llama
from upstream_programs import templates_dir

RAISING = ("{% for m in messages %}\n"
           "{% if 'forbidden' in m.content %}\n"
           "{{ raise_exception('no forbidden messages here') }}\n"
           "{% endif %}{{ m.role }}: {{ m.content }}\n"
           "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def test_a_template_file_renders_as_the_same_string(tmp_path):
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    messages = [{"role": "user", "content": "Grüße <b>"}]
    assert ChatTemplate.from_file(path).render(messages) == ChatTemplate(CHATML).render(messages) == \
        "<|im_start|>user\nGrüße <b><|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("source, line", [("hello\n{{ messages[0].content }}\n{{ messages[0].content }", 3),
                                          ("{% if true %}\n\n{{ 'unclosed }}", 3),
                                          ("a\nb\n{{ messages | nosuchfilter }}", 3)])
def test_a_template_that_does_not_parse_names_the_file_and_line(tmp_path, source, line):
    path = tmp_path / "broken.jinja"
    path.write_text(source)
    with pytest.raises(ChatTemplateError, match=rf"chat template {re.escape(str(path))}\b.*line {line}\b") as caught:
        ChatTemplate.from_file(path).render([{"role": "user", "content": "hi"}])
    assert "broken.jinja" in str(caught.value)


def test_a_template_that_raises_for_a_conversation_names_it_and_the_line():
    template = ChatTemplate(RAISING, name="strict.jinja")
    assert template.render([{"role": "user", "content": "hi"}]) == "user: hi\nassistant:"
    with pytest.raises(ChatTemplateError, match=r"chat template strict\.jinja failed to render: line 3\b(.|\n)*no forbidden "
                                                r"messages here"):
        template.render([{"role": "user", "content": "a forbidden word"}])


def test_a_missing_or_empty_file_is_a_typed_error(tmp_path):
    with pytest.raises(ChatTemplateError, match="cannot read the chat template file"):
        ChatTemplate.from_file(tmp_path / "absent.jinja")
    (tmp_path / "empty.jinja").write_text("")
    with pytest.raises(ChatTemplateError, match="is empty"):
        ChatTemplate.from_file(tmp_path / "empty.jinja")
    with pytest.raises(ChatTemplateError, match="empty"):
        ChatTemplate("")


def test_a_model_template_from_a_file_takes_the_models_bos(tiny_model, tmp_path):
    path = tmp_path / "bos.jinja"
    path.write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    assert ChatTemplate.for_model(tiny_model, file=path).render([{"role": "user", "content": "x"}]) == "<s>x"
    assert isinstance(tiny_model, Model)


def test_the_server_refuses_to_start_with_a_template_file_that_does_not_parse(tiny_model_path, tmp_path):
    path = tmp_path / "broken.jinja"
    path.write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    run = subprocess.run([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(tiny_model_path),
                          "--port", str(free_port()), "--n-ctx", str(N_CTX), "--chat-template-file", str(path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)  # (not the source tree)
    assert run.returncode != 0
    assert f"--chat-template-file: invalid chat template {path}: line 2" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_a_template_that_raises_for_a_request_is_a_400_naming_it(tiny_model_path, tmp_path):
    path = tmp_path / "strict.jinja"
    path.write_text(RAISING)
    server = start_server(tiny_model_path, tmp_path, "--chat-template-file", str(path))
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "a forbidden word"}], "max_tokens": 2}
        status, answer = server.request("POST", "/v1/chat/completions", body)
        assert status == 400, answer
        assert "strict.jinja" in answer["error"]["message"] and "line 3" in answer["error"]["message"]
        assert "no forbidden messages here" in answer["error"]["message"]
        hi = [{"role": "user", "content": "hi"}]
        status, answer = server.request("POST", "/apply-template", {"messages": hi})
        assert status == 200 and answer == {"prompt": "user: hi\nassistant:"}
        status, answer = server.request("POST", "/v1/chat/completions", {**body, "messages": hi})
        assert status == 200, answer
    finally:
        stop_server(server)


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_a_gguf_files_tool_use_template_renders_the_requests_with_tools(tmp_path):
    """A GGUF file with a second template for requests with tools (tokenizer.chat_template.tool_use), as
    llama.cpp's common_chat_templates_init reads it: a request with tools is rendered with it, one
    without with the default; tools are native as the variant's (its format's name); a file with the
    variant alone has it as its default too."""
    qwen = (templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    both = write_tiny_llama(tmp_path / "both.gguf", chat_template=[{"name": "default", "template": CHATML},
                                                                   {"name": "tool_use", "template": qwen}])
    template = ChatTemplate.for_model(Model(both))
    ask = [{"role": "user", "content": "The weather in Paris?"}]
    assert template.render(ask) == ChatTemplate(CHATML).render(ask)
    with_tools = template.render(ask, tools=[WEATHER])
    assert with_tools == ChatTemplate(qwen, bos_token="<s>", eos_token="</s>").render(ask, tools=[WEATHER])
    assert "<tools>" in with_tools and template.native_tools and template.tool_format == "hermes"
    assert not ChatTemplate(CHATML).takes_tools
    alone = ChatTemplate.for_model(Model(write_tiny_llama(tmp_path / "alone.gguf",
                                                          chat_template=[{"name": "tool_use", "template": qwen}])))
    assert alone.render(ask) == ChatTemplate(qwen).render(ask) and alone.tool_format == "hermes"
