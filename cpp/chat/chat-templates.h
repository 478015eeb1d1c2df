#pragma once

// chat/chat-templates: a model's chat templates applied by llama.cpp's own chat layer
// (common/chat: its jinja engine, a parser per tool-call format, the auto-parser), the way
// llama-server applies them: the prompt, the reply's grammar and the parser of the reply.
// Requests and replies cross as JSON text in the OpenAI shape (messages, tools, a message).

#include "base/types.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

struct common_chat_templates;
struct common_chat_parser_params;

// When the grammar starts constraining a lazy reply (common_grammar_trigger).
struct llama_opt_chat_trigger {
    std::string kind;   // "token", "word", "pattern" (anywhere) or "pattern_full" (the whole output)
    std::string value;
    llama_token token = -1;  // kind "token": its id
};

// Parses a reply (the model's text after the prompt) as the format of the prompt it answers.
class llama_opt_chat_reply_parser {
public:
    explicit llama_opt_chat_reply_parser(std::unique_ptr<common_chat_parser_params> params);
    ~llama_opt_chat_reply_parser();

    // The reply as an OpenAI assistant message, JSON text: content, reasoning_content, tool_calls.
    // is_partial: the reply may go on (a call broken off so far is left out, not an error).
    // Throws llama_opt_error(chat_template) where a whole reply does not parse.
    std::string parse(const std::string & text, bool is_partial) const;

private:
    std::unique_ptr<common_chat_parser_params> params_;
};

// A conversation rendered: what llama-server's /apply-template and chat routes compute.
struct llama_opt_chat_prompt {
    std::string prompt;
    std::string format;                        // common_chat_format_name: "Content-only", "peg-native", ...
    std::string grammar;                       // GBNF of the reply (tool calls), "" if unconstrained
    bool        grammar_lazy = false;          // applied only from a trigger on
    std::vector<llama_opt_chat_trigger> grammar_triggers;
    std::vector<std::string> preserved_tokens; // special tokens the reply's markup is made of
    std::vector<std::string> additional_stops;
    std::string generation_prompt;             // what the prompt ends with to open the reply
    bool        supports_thinking = false;
    std::string thinking_start_tag;
    std::vector<std::string> thinking_end_tags;
    std::shared_ptr<llama_opt_chat_reply_parser> parser;
};

class llama_opt_chat_templates {
public:
    // A template with the BOS/EOS text it is given; `name` names it in errors. Built without the
    // model on purpose: with one, llama.cpp strips a leading BOS text from the prompt when the
    // vocabulary adds BOS itself, and the prompt's tokens (special text parsed, no BOS added: the
    // callers keep a message's text apart from the markup) would lose it.
    llama_opt_chat_templates(const std::string & source, const std::string & bos, const std::string & eos,
                             const std::string & name);
    ~llama_opt_chat_templates();

    // Renders a request given as JSON text: {"messages": [...], "tools": [...], "tool_choice":
    // "auto"|"required"|"none", "parallel_tool_calls": bool, "add_generation_prompt": bool,
    // "enable_thinking": bool, "chat_template_kwargs": {...}, "reasoning_format": "auto"|...}
    // (each optional but messages). Throws llama_opt_error(chat_template) naming the template
    // and, where the engine tells it, the line.
    llama_opt_chat_prompt apply(const std::string & request_json) const;

    const std::string & name() const { return name_; }
    std::string source() const;
    std::map<std::string, bool> caps() const;

private:
    std::unique_ptr<common_chat_templates, void (*)(common_chat_templates *)> tmpls_;
    std::string name_;
};
