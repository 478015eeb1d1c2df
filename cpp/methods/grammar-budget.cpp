#include "methods/grammar-budget.h"

#include "llama-grammar.h"  // llama.cpp's internal grammar (src/)

#include <algorithm>

namespace {

constexpr uint32_t unreachable = UINT32_MAX / 4;  // no expansion (yet): sums of two stay below UINT32_MAX

// The characters of the elements from `e` to the end of its alternative, each rule at its
// shortest expansion (a class and its ranges and alternatives are one character).
uint32_t rest_chars(const llama_grammar_element * e, const std::vector<uint32_t> & min_chars) {
    uint32_t n = 0;
    for (; e->type != LLAMA_GRETYPE_END && e->type != LLAMA_GRETYPE_ALT; ++e) {
        if (e->type == LLAMA_GRETYPE_RULE_REF) {
            n = std::min(n + min_chars[e->value], unreachable);
        } else if (e->type != LLAMA_GRETYPE_CHAR_RNG_UPPER && e->type != LLAMA_GRETYPE_CHAR_ALT) {
            n = std::min(n + 1, unreachable);
        }
    }
    return n;
}

// Each rule's shortest expansion, in characters: relaxed until nothing changes (lengths only
// shrink, and a recursive alternative never beats the one that ends the recursion).
std::vector<uint32_t> shortest_expansions(const llama_grammar_rules & rules) {
    std::vector<uint32_t> min_chars(rules.size(), unreachable);
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < rules.size(); ++r) {
            const llama_grammar_element * e = rules[r].data();
            for (;;) {  // each alternative
                const uint32_t n = rest_chars(e, min_chars);
                if (n < min_chars[r]) {
                    min_chars[r] = n;
                    changed      = true;
                }
                while (e->type != LLAMA_GRETYPE_END && e->type != LLAMA_GRETYPE_ALT) {
                    ++e;
                }
                if (e->type == LLAMA_GRETYPE_END) {
                    break;
                }
                ++e;
            }
        }
    }
    return min_chars;
}

}  // namespace

llama_opt_grammar_budget::llama_opt_grammar_budget(llama_grammar & grammar, const llama_vocab * vocab)
    : grammar_(grammar), vocab_(vocab) {}

void llama_opt_grammar_budget::spend_token() {
    if (tokens_ != none && tokens_ > 0) {
        --tokens_;
    }
}

llama_token llama_opt_grammar_budget::give_up(llama_token pick) {
    tokens_ = none;  // the rule cannot close this output: no later step scans every allowed token again
    return pick;
}

uint32_t llama_opt_grammar_budget::chars_to_end() {
    if (min_chars_.empty()) {
        min_chars_ = shortest_expansions(grammar_.rules);
    }
    uint32_t shortest = unreachable;
    for (const llama_grammar_stack & stack : grammar_.stacks) {  // each position still to finish its alternative
        uint32_t n = 0;
        for (const llama_grammar_element * e : stack) {
            n = std::min(n + rest_chars(e, min_chars_), unreachable);
        }
        shortest = std::min(shortest, n);
    }
    return shortest;
}

bool llama_opt_grammar_budget::fits(llama_token token) {
    if (tokens_ == none || llama_vocab_is_eog(vocab_, token)) {
        return true;
    }
    // taken on the grammar itself, then undone: a non-lazy grammar's state is its stacks and
    // partial character
    llama_grammar_stacks     stacks  = grammar_.stacks;
    const llama_partial_utf8 partial = grammar_.partial_utf8;
    llama_grammar_accept_impl(grammar_, token);
    // a character left unfinished needs its remaining bytes first, possibly a token each
    const size_t to_end = (size_t) chars_to_end() + (size_t) std::max(0, grammar_.partial_utf8.n_remain);
    grammar_.stacks       = std::move(stacks);
    grammar_.partial_utf8 = partial;
    return to_end + 2 <= tokens_;  // this token, the completion, the end of generation
}

llama_token llama_opt_grammar_budget::first_fitting(const std::vector<llama_token> & ids) {
    for (llama_token t : ids) {
        if (fits(t)) {
            return t;
        }
    }
    return -1;
}
