// llama_opt_grammar, forced tokens (the specification's schema-skip): what the grammar leaves a
// single choice for, and the specification's interface to it.

#include "methods/grammar.h"

#include "llama-grammar.h"  // llama.cpp's internal grammar (src/)
#include "methods/grammar-chars.h"

#include <algorithm>

llama_token llama_opt_grammar::forced() {
    check_timer timer{ check_ns_ };
    const int64_t c = llama_opt_grammar_only_next_char(*grammar_);
    if (c < 0) {
        return -1;
    }
    const uint64_t key = state_key();
    llama_token    only;
    if (vocab_->forced(key, only)) {
        return only;
    }
    // only tokens starting with that character can be allowed; stop at the second one
    const std::vector<llama_token> & bucket = vocab_->starting_with((uint8_t) llama_opt_utf8(c)[0]);
    only = -2;
    for (size_t start = 0; start < bucket.size() && only != -1; start += 1024) {
        for (llama_token t : allowed(bucket.data() + start, std::min<size_t>(1024, bucket.size() - start))) {
            only = only == -2 ? t : -1;
        }
    }
    vocab_->remember_forced(key, only);
    return only;
}

std::vector<llama_token> llama_opt_grammar::forced_run(size_t max_tokens) {
    llama_opt_grammar        probe(vocab_, llama_grammar_clone_impl(*grammar_), text_hash_);
    std::vector<llama_token> run;
    for (llama_token t; run.size() < max_tokens && (t = probe.forced()) >= 0;) {
        probe.accept(t);
        run.push_back(t);
    }
    check_ns_ += probe.check_ns_;
    return run;
}

std::string llama_opt_grammar::forced_text(size_t max_chars) {
    check_timer timer{ check_ns_ };
    llama_grammar * probe = llama_grammar_clone_impl(*grammar_);
    std::string text;
    for (size_t i = 0; i < max_chars; ++i) {
        const int64_t c = llama_opt_grammar_only_next_char(*probe);
        if (c < 0) {
            break;
        }
        llama_grammar_accept(probe, (uint32_t) c);
        text += llama_opt_utf8(c);
    }
    llama_grammar_free_impl(probe);
    return text;
}

llama_opt_skip_result llama_opt_schema_query_next(llama_opt_grammar & grammar) {
    const llama_token only = grammar.forced();
    llama_opt_skip_result result;
    result.can_skip     = only >= 0;
    result.forced_token = only >= 0 ? only : -1;
    result.dead_end     = only == -2;
    return result;
}

llama_opt_skip_sequence llama_opt_schema_query_sequence(llama_opt_grammar & grammar, uint32_t max_lookahead) {
    llama_opt_skip_sequence sequence;
    sequence.tokens = grammar.forced_run(max_lookahead);
    sequence.n_skip = (uint32_t) sequence.tokens.size();
    return sequence;
}
