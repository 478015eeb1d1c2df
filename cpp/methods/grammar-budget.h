#pragma once

// methods/grammar-budget: ending a grammar's output within a token budget
// (schema_fit_max_tokens). With `tokens` left for the output, a token fits when after it the
// grammar can still end in time: its shortest completion, a token per character (every
// character has one), then the end-of-generation token. methods/grammar's picks take only
// tokens that fit, so an output that would be cut off is closed in time.

#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <vector>

struct llama_grammar;

class llama_opt_grammar_budget {
public:
    static constexpr size_t none = SIZE_MAX;  // no budget: every token fits

    // The budget of this grammar (of a non-lazy grammar: fits() undoes a token by restoring
    // its stacks and partial character); none until set.
    llama_opt_grammar_budget(llama_grammar & grammar, const llama_vocab * vocab);

    void set(size_t tokens) { tokens_ = tokens; }
    bool active() const { return tokens_ != none; }
    // a token was taken: one less left
    void spend_token();

    // After this token (allowed here), the grammar can still end within the budget.
    bool        fits(llama_token token);
    llama_token first_fitting(const std::vector<llama_token> & ids);  // -1: none
    // Nothing fits (a budget too small from the start): the budget is dropped; returns pick.
    llama_token give_up(llama_token pick);

    // Counts a pick (or a set to sample from) the budget changed.
    void     count_pick(bool changed) { picks_ += changed; }
    uint64_t picks() const { return picks_; }

private:
    llama_grammar &       grammar_;
    const llama_vocab *   vocab_;
    size_t                tokens_ = none;  // tokens left for the output
    std::vector<uint32_t> min_chars_;      // per rule: its shortest expansion (when first needed)
    uint64_t              picks_ = 0;

    uint32_t chars_to_end();  // the characters of the shortest completion from here
};
