#pragma once

// llama-schema-skip: grammar-constrained generation that does not pay a vocabulary scan per
// token, and that knows when the grammar leaves a single choice.
//
// llama.cpp's grammar sampler checks every candidate of the 262k-token vocabulary against the
// grammar at every step. Greedy decoding needs only the allowed token with the highest logit:
// best() checks candidates in descending logit order and stops at the first the grammar
// accepts, which is what masking the whole vocabulary and taking the argmax gives (ties: the
// lowest id). forced() answers "does the grammar allow exactly one token here?" by scanning
// the vocabulary until a second allowed token turns up, and remembers the answer per grammar
// state (process-wide, by grammar text and state), so a state costs a full scan only once.
//
// Uses llama.cpp's internal grammar (src/llama-grammar.h): the public sampler API has no way
// to ask what a state allows without a full scan.

#include "llama-opt.h"
#include "llama.h"

#include <cstdint>
#include <string>
#include <vector>

struct llama_grammar;

class llama_opt_grammar {
public:
    // Parses a GBNF grammar; throws llama_opt_error(grammar) with llama.cpp's message.
    llama_opt_grammar(const llama_vocab * vocab, const std::string & gbnf, const std::string & root = "root");
    ~llama_opt_grammar();

    llama_opt_grammar(const llama_opt_grammar &)             = delete;
    llama_opt_grammar & operator=(const llama_opt_grammar &) = delete;

    // The allowed token with the highest logit (ties: lowest id); -1 if none is allowed.
    // full_mask: check every token of the vocabulary (the reference, as llama.cpp does).
    llama_token best(const float * logits, bool full_mask = false);
    // The k allowed tokens with the highest logits (all allowed ones if k <= 0), for sampling.
    std::vector<llama_token_data> top_allowed(const float * logits, int32_t k);
    // The only token allowed here; -1 if several are, -2 if none is.
    llama_token forced();
    // The text the grammar forces from here (at most max_chars characters), as UTF-8: every
    // continuation starts with it. Empty if the next character is not unique.
    std::string forced_text(size_t max_chars);
    // Whether the grammar allows this token here.
    bool allows(llama_token token);
    // Advances the grammar by a token (which must be allowed).
    void accept(llama_token token);

    uint64_t check_ns() const { return check_ns_; }  // time spent in best/top_allowed/forced

private:
    llama_grammar *     grammar_;
    const llama_vocab * vocab_;
    int32_t             n_vocab_;
    uint64_t            text_hash_;   // the grammar's identity in the forced() cache
    uint64_t            check_ns_ = 0;

    uint64_t state_key() const;  // the grammar state, independent of this object's addresses
    // Which of `ids` the grammar allows, in the order given.
    std::vector<llama_token> allowed(const llama_token * ids, size_t n) const;
    std::vector<llama_token> ranked(const float * logits, size_t k) const;  // top k ids by logit
    std::vector<llama_token> candidates() const;  // a superset of the allowed tokens, often small
    std::vector<llama_token> all_tokens() const;
    llama_token best_of(const std::vector<llama_token> & ids, const float * logits) const;  // -1: none allowed
};
