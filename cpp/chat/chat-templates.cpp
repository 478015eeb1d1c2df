#include "chat/chat-templates.h"

#include "chat.h"
#include "json.h"
#include "log.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>

// common/ logs through its own worker thread; our errors carry what it would print.
static void silence_common_log() {
    static std::once_flag once;
    std::call_once(once, [] { common_log_set_verbosity_thold(-1); });
}

// The line a jinja error is on. The runtime's messages say "at line N, column M"; the lexer's and
// the parser's show the source around the error ("...excerpt...\n<spaces>^", newlines drawn as
// "↵") but not its position: it is found again from the excerpt. 0 if the message says neither.
static size_t error_line(const std::string & source, const std::string & message) {
    const std::string at_line = " at line ";
    const size_t said = message.find(at_line);
    if (said != std::string::npos) {
        return (size_t) std::strtoul(message.c_str() + said + at_line.size(), nullptr, 10);
    }
    const size_t caret = message.rfind('^');
    const size_t caret_line = caret == std::string::npos ? std::string::npos : message.rfind('\n', caret);
    if (caret_line == std::string::npos || caret_line == 0) {
        return 0;
    }
    const size_t excerpt_line = message.rfind('\n', caret_line - 1);
    std::string  excerpt      = message.substr(excerpt_line == std::string::npos ? 0 : excerpt_line + 1,
                                               caret_line - (excerpt_line == std::string::npos ? 0 : excerpt_line + 1));
    if (excerpt.size() < 6 || excerpt.compare(0, 3, "...") != 0) {
        return 0;
    }
    excerpt = excerpt.substr(3, excerpt.size() - 6);
    for (size_t at; (at = excerpt.find("\u21b5")) != std::string::npos;) {
        excerpt.replace(at, 3, "\n");
    }
    const size_t start = source.find(excerpt);
    const size_t column = caret - caret_line - 1;  // (3 dots, then the excerpt)
    if (start == std::string::npos || column < 3) {
        return 0;
    }
    const size_t pos = std::min(source.size(), start + column - 3);
    return 1 + (size_t) std::count(source.begin(), source.begin() + (std::ptrdiff_t) pos, '\n');
}

// "invalid chat template NAME: line N: ..." (it does not parse) or "chat template NAME failed to
// render: line N: ..." (it raised for this conversation).
static llama_opt_error template_error(const std::string & prefix, const std::string & name, const std::string & suffix,
                                      const std::string & source, const std::string & what) {
    std::string message = prefix + "chat template " + name + suffix + ": ";
    const size_t line = error_line(source, what);
    if (line > 0) {
        message += "line " + std::to_string(line) + ": ";
    }
    return llama_opt_error(llama_opt_errc::chat_template, message + what);
}

static const char * trigger_kind(common_grammar_trigger_type type) {
    switch (type) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:        return "token";
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD:         return "word";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:      return "pattern";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: return "pattern_full";
    }
    return "unknown";
}

llama_opt_chat_reply_parser::llama_opt_chat_reply_parser(std::unique_ptr<common_chat_parser_params> params)
    : params_(std::move(params)) {}

llama_opt_chat_reply_parser::~llama_opt_chat_reply_parser() = default;

std::string llama_opt_chat_reply_parser::parse(const std::string & text, bool is_partial) const {
    try {
        return common_chat_parse(text, is_partial, *params_).to_json_oaicompat().dump_safe();
    } catch (const std::exception & e) {
        throw llama_opt_error(llama_opt_errc::chat_template, e.what());
    }
}

llama_opt_chat_templates::llama_opt_chat_templates(const std::string & source, const std::string & bos,
                                                   const std::string & eos, const std::string & name)
    : tmpls_(nullptr, common_chat_templates_free), name_(name) {
    silence_common_log();
    if (source.empty()) {  // (common_chat_templates_init would read a model's, and there is none)
        throw llama_opt_error(llama_opt_errc::chat_template, "chat template " + name + ": the template is empty");
    }
    try {
        // parsed once on its own first: common_chat_templates_init rethrows a parse error sliced to
        // std::exception, its message lost
        common_chat_template parsed(source, bos, eos);
        tmpls_.reset(common_chat_templates_init(nullptr, source, bos, eos).release());
    } catch (const std::exception & e) {
        throw template_error("invalid ", name_, "", source, e.what());
    }
}

llama_opt_chat_templates::~llama_opt_chat_templates() = default;

std::string llama_opt_chat_templates::source() const {
    return common_chat_templates_source(tmpls_.get());
}

std::map<std::string, bool> llama_opt_chat_templates::caps() const {
    return common_chat_templates_get_caps(tmpls_.get());
}

llama_opt_chat_prompt llama_opt_chat_templates::apply(const std::string & request_json) const {
    common_chat_templates_inputs inputs;
    common_chat_params           params;
    try {
        const common_json request = common_json::parse(request_json);
        inputs.messages           = common_chat_msgs_parse_oaicompat(request.at("messages"));
        inputs.tools              = common_chat_tools_parse_oaicompat(request.value("tools", common_json()));
        inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(request.value("tool_choice", std::string("auto")));
        inputs.parallel_tool_calls   = request.value("parallel_tool_calls", caps()["supports_parallel_tool_calls"]);
        inputs.add_generation_prompt = request.value("add_generation_prompt", true);
        inputs.enable_thinking       = request.value("enable_thinking", true);
        inputs.reasoning_format =
            common_reasoning_format_from_name(request.value("reasoning_format", std::string("auto")));
        if (request.contains("chat_template_kwargs")) {
            for (const auto & [key, value] : request.at("chat_template_kwargs").items()) {
                inputs.chat_template_kwargs[key] = value.dump();
            }
        }
        params = common_chat_templates_apply(tmpls_.get(), inputs);
    } catch (const std::exception & e) {
        throw template_error("", name_, " failed to render", source(), e.what());
    }

    llama_opt_chat_prompt out{ params.prompt, common_chat_format_name(params.format), params.grammar,
                               params.grammar_lazy, {}, params.preserved_tokens, params.additional_stops,
                               params.generation_prompt, params.supports_thinking, params.thinking_start_tag,
                               params.thinking_end_tags, nullptr };
    for (const auto & t : params.grammar_triggers) {
        out.grammar_triggers.push_back({ trigger_kind(t.type), t.value, t.token });
    }
    auto parser_params = std::make_unique<common_chat_parser_params>(params);
    parser_params->reasoning_format = inputs.reasoning_format;
    if (!params.parser.empty()) {
        parser_params->parser.load(params.parser);
    }
    out.parser = std::make_shared<llama_opt_chat_reply_parser>(std::move(parser_params));
    return out;
}
