#include "methods/grammar-trigger.h"

#include <algorithm>

llama_opt_trigger_kind llama_opt_trigger_kind_from_name(const std::string & name) {
    if (name == "token") {
        return llama_opt_trigger_kind::token;
    }
    if (name == "word") {
        return llama_opt_trigger_kind::word;
    }
    if (name == "pattern") {
        return llama_opt_trigger_kind::pattern;
    }
    if (name == "pattern_full") {
        return llama_opt_trigger_kind::pattern_full;
    }
    throw llama_opt_error(llama_opt_errc::invalid_argument,
                          "a grammar trigger's kind is 'token', 'word', 'pattern' or 'pattern_full', not '" + name + "'");
}

llama_opt_grammar_trigger_watch::llama_opt_grammar_trigger_watch(const std::vector<llama_opt_grammar_trigger> & triggers) {
    if (triggers.empty()) {
        throw llama_opt_error(llama_opt_errc::grammar, "a lazy grammar needs at least one trigger");
    }
    for (const llama_opt_grammar_trigger & t : triggers) {
        switch (t.kind) {
            case llama_opt_trigger_kind::token:
                tokens_.push_back(t.token);
                break;
            case llama_opt_trigger_kind::word:
                if (t.value.empty()) {
                    throw llama_opt_error(llama_opt_errc::grammar, "a grammar trigger word is empty");
                }
                patterns_.push_back({ true, t.value, std::regex() });
                break;
            case llama_opt_trigger_kind::pattern:
            case llama_opt_trigger_kind::pattern_full: {
                std::string source = t.value;
                if (t.kind == llama_opt_trigger_kind::pattern_full) {  // (common/sampling.cpp's anchoring)
                    source = source.empty() ? "^$"
                                            : (source.front() != '^' ? "^" : "") + source + (source.back() != '$' ? "$" : "");
                }
                try {
                    patterns_.push_back({ false, source, std::regex(source) });
                } catch (const std::regex_error & e) {
                    throw llama_opt_error(llama_opt_errc::grammar,
                                          "invalid grammar trigger pattern '" + t.value + "': " + e.what());
                }
                break;
            }
        }
    }
}

// llama_grammar_trigger_pattern::find: a pattern written ^...$ is first matched against the whole
// output; then (or otherwise) searched for anywhere. The grammar's text starts at the first
// capturing group that matched something, else at the match.
size_t llama_opt_grammar_trigger_watch::match_start(const pattern & p, size_t added) const {
    if (p.is_word) {
        // a match ends in the text just added (none was found before it)
        const size_t from = text_.size() - std::min(text_.size(), added + p.source.size() - 1);
        return text_.find(p.source, from);
    }
    auto start_of = [](const std::smatch & match) {
        for (size_t i = 1; i < match.size(); ++i) {
            if (match.length(i) > 0) {
                return (size_t) match.position(i);
            }
        }
        return (size_t) match.position(0);
    };
    std::smatch match;
    if (!p.source.empty() && p.source.front() == '^' && p.source.back() == '$' &&
        std::regex_match(text_, match, p.regex)) {
        return start_of(match);
    }
    if (std::regex_search(text_, match, p.regex)) {
        return start_of(match);
    }
    return std::string::npos;
}

bool llama_opt_grammar_trigger_watch::fires(llama_token token, const std::string & text,
                                            std::vector<llama_opt_token_text> & start) {
    start.clear();
    if (std::find(tokens_.begin(), tokens_.end(), token) != tokens_.end()) {
        start.push_back({ token, text });
        return true;
    }
    buffered_.push_back({ token, text_.size(), text_.size() + text.size() });
    text_ += text;
    for (const pattern & p : patterns_) {
        const size_t at = match_start(p, text.size());
        if (at == std::string::npos) {
            continue;
        }
        for (const buffered & b : buffered_) {  // the tokens that overlap the text from the match on
            if (b.end > at) {
                const size_t from = std::max(b.begin, at);
                start.push_back({ b.token, text_.substr(from, b.end - from) });
            }
        }
        return true;
    }
    return false;
}
