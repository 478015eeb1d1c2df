#pragma once

// methods/grammar-trigger: when a lazy grammar starts constraining, as llama.cpp's lazy grammar
// sampler decides it (llama_sampler_init_grammar_lazy_patterns, src/llama-grammar.cpp, with the
// triggers common/sampling.cpp makes of common_chat_params::grammar_triggers). A lazy grammar
// waits while the output is free; the generated tokens' text is buffered, and the grammar starts
// at the first trigger that fires: a trigger token generated (then the grammar takes that token),
// or a word or pattern found in the text (then the grammar takes the text from the match on: the
// tokens that overlap it, the first one only from where the match begins).
// Plain C++17 with no dependency on llama.cpp.

#include "base/types.h"

#include <regex>
#include <string>
#include <vector>

enum class llama_opt_trigger_kind {
    token,         // a token id
    word,          // a literal text, anywhere in the output
    pattern,       // a regular expression (ECMAScript), found anywhere in the output
    pattern_full,  // a regular expression the whole output must match (anchored with ^...$)
};

struct llama_opt_grammar_trigger {
    llama_opt_trigger_kind kind  = llama_opt_trigger_kind::word;
    std::string            value;       // the word or pattern
    llama_token            token = -1;  // kind token: its id
};

// "token", "word", "pattern", "pattern_full" (common_grammar_trigger_type's names); throws
// llama_opt_error(invalid_argument) for another name.
llama_opt_trigger_kind llama_opt_trigger_kind_from_name(const std::string & name);

// A token and the part of its text the grammar is to take.
struct llama_opt_token_text {
    llama_token token;
    std::string text;
};

class llama_opt_grammar_trigger_watch {
public:
    // Throws llama_opt_error(grammar) for a pattern that is not a valid regular expression, or
    // for no trigger at all (a lazy grammar that could never start).
    explicit llama_opt_grammar_trigger_watch(const std::vector<llama_opt_grammar_trigger> & triggers);

    // A generated token and its text (special tokens' text included). Returns true when it fires
    // a trigger; `start` then holds what the grammar takes, in order (the watch is spent).
    bool fires(llama_token token, const std::string & text, std::vector<llama_opt_token_text> & start);

private:
    struct pattern {
        bool        is_word = false;  // a word: a plain search (llama.cpp searches for it escaped)
        std::string source;           // the word, or the pattern (a full one anchored, as llama.cpp's sampler gets it)
        std::regex  regex;
    };
    struct buffered {
        llama_token token;
        size_t      begin, end;  // its text in text_
    };

    // where the grammar's text begins in text_; npos: no match. `added`: the last token's text size
    size_t match_start(const pattern & p, size_t added) const;

    std::vector<llama_token> tokens_;
    std::vector<pattern>     patterns_;  // in the order given: the first that matches fires
    std::string              text_;      // the output so far
    std::vector<buffered>    buffered_;
};
