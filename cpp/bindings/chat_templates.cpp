// ChatTemplates (llama_opt_chat_templates), its RenderedChat and ChatReplyParser.

#include "bindings.h"

#include "chat/chat-templates.h"

#include <pybind11/stl.h>

void register_chat_templates(py::module_ & m) {
    py::class_<llama_opt_chat_reply_parser, std::shared_ptr<llama_opt_chat_reply_parser>>(
        m, "ChatReplyParser", "Parses a reply in the format of the prompt it answers (RenderedChat.parser).")
        .def("parse", [](const llama_opt_chat_reply_parser & self, const std::string & text, bool is_partial) {
                 std::string message;
                 {
                     py::gil_scoped_release nogil;
                     message = self.parse(text, is_partial);
                 }
                 return decode_utf8(message);
             }, py::arg("text"), py::arg("is_partial"), R"doc(
The reply as an OpenAI assistant message, JSON text (content, reasoning_content, tool_calls).

    parser.parse('<tool_call>{"name": "f", "arguments": {}}</tool_call>', is_partial=False)
)doc");

    py::class_<llama_opt_chat_prompt>(m, "RenderedChat", "A conversation rendered by llama.cpp's chat layer.")
        .def_property_readonly("prompt", [](const llama_opt_chat_prompt & r) { return decode_utf8(r.prompt); })
        .def_readonly("format", &llama_opt_chat_prompt::format)
        .def_readonly("grammar", &llama_opt_chat_prompt::grammar)
        .def_readonly("grammar_lazy", &llama_opt_chat_prompt::grammar_lazy)
        .def_property_readonly("grammar_triggers", [](const llama_opt_chat_prompt & r) {
            py::list out;
            for (const auto & t : r.grammar_triggers) {
                out.append(py::make_tuple(t.kind, decode_utf8(t.value), t.token));
            }
            return out;
        }, "(kind, value, token) of each trigger: kind 'token', 'word', 'pattern' or 'pattern_full'.")
        .def_readonly("preserved_tokens", &llama_opt_chat_prompt::preserved_tokens)
        .def_readonly("additional_stops", &llama_opt_chat_prompt::additional_stops)
        .def_property_readonly("generation_prompt", [](const llama_opt_chat_prompt & r) {
            return decode_utf8(r.generation_prompt);
        })
        .def_readonly("supports_thinking", &llama_opt_chat_prompt::supports_thinking)
        .def_readonly("thinking_start_tag", &llama_opt_chat_prompt::thinking_start_tag)
        .def_readonly("thinking_end_tags", &llama_opt_chat_prompt::thinking_end_tags)
        .def_readonly("parser", &llama_opt_chat_prompt::parser);

    py::class_<llama_opt_chat_templates, std::shared_ptr<llama_opt_chat_templates>>(m, "ChatTemplates", R"doc(
A model's chat templates, applied by llama.cpp's chat layer (common/chat) as llama-server does.

    t = ChatTemplates.from_source(source, "<s>", "</s>", "my.jinja")
    r = t.apply('{"messages": [{"role": "user", "content": "hi"}]}')
    r.prompt, r.format, r.grammar, r.parser.parse(reply_text, is_partial=False)
)doc")
        .def_static("from_source", [](const std::string & source, const std::string & bos, const std::string & eos,
                                      const std::string & name) {
                        py::gil_scoped_release nogil;
                        return std::make_shared<llama_opt_chat_templates>(source, bos, eos, name);
                    }, py::arg("source"), py::arg("bos_token"), py::arg("eos_token"), py::arg("name"))
        .def("apply", &llama_opt_chat_templates::apply, py::arg("request_json"),
             py::call_guard<py::gil_scoped_release>(), R"doc(
Renders a request (JSON text: messages, tools, tool_choice, parallel_tool_calls,
add_generation_prompt, enable_thinking, chat_template_kwargs, reasoning_format).
Raises ChatTemplateError naming the template (and the line, where known).
)doc")
        .def_property_readonly("name", &llama_opt_chat_templates::name)
        .def_property_readonly("source", [](const llama_opt_chat_templates & t) { return decode_utf8(t.source()); })
        .def_property_readonly("caps", &llama_opt_chat_templates::caps,
                               "What the template supports (supports_tools, supports_system_role, ...).");
}
