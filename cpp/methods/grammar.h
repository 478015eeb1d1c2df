#pragma once

// methods/grammar (the specification's schema-skip): grammar-constrained generation that
// does not pay a vocabulary scan per token, and that knows when the grammar leaves a single choice.
//
// llama.cpp's grammar sampler checks every candidate of the 262k-token vocabulary against the
// grammar at every step. Greedy decoding needs only the allowed token with the highest logit:
// best() checks candidates in descending logit order and stops at the first the grammar
// accepts, which is what masking the whole vocabulary and taking the argmax gives (ties: the
// lowest id). forced() answers "does the grammar allow exactly one token here?" by scanning
// the tokens that start with the one allowed character until a second allowed one turns up.
// Answers that needed a scan are remembered per grammar state in the model's
// llama_opt_grammar_vocab (methods/grammar-vocab).
//
// Uses llama.cpp's internal grammar (src/llama-grammar.h): the public sampler API has no way
// to ask what a state allows without a full scan. This class is written in three files: the
// grammar state and what it allows (methods/grammar.cpp), picks by logit among the allowed
// tokens (methods/grammar-mask.cpp), and the tokens and text the grammar forces, with the
// specification's interface to them (methods/grammar-forced.cpp).

#include "methods/grammar-budget.h"
#include "methods/grammar-vocab.h"
#include "llama.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct llama_grammar;

class llama_opt_grammar {
public:
    // Parses a GBNF grammar; throws llama_opt_error(grammar) with llama.cpp's message.
    llama_opt_grammar(std::shared_ptr<llama_opt_grammar_vocab> vocab, const std::string & gbnf,
                      const std::string & root = "root");
    ~llama_opt_grammar();

    llama_opt_grammar(const llama_opt_grammar &)             = delete;
    llama_opt_grammar & operator=(const llama_opt_grammar &) = delete;

    // The allowed token with the highest logit (ties: lowest id); -1 if none is allowed.
    // full_mask: check every token of the vocabulary (the reference, as llama.cpp does).
    llama_token best(const float * logits, bool full_mask = false);
    // The k allowed tokens with the highest logits (all allowed ones if k <= 0), for sampling;
    // full_mask: from every token of the vocabulary checked (the reference).
    std::vector<llama_token_data> top_allowed(const float * logits, int32_t k, bool full_mask = false);
    // The only token allowed here; -1 if several are, -2 if none is.
    llama_token forced();
    // The tokens forced one after another from here (at most max_tokens), looked up on a copy:
    // this grammar does not move.
    std::vector<llama_token> forced_run(size_t max_tokens);
    // The text the grammar forces from here (at most max_chars characters), as UTF-8: every
    // continuation starts with it. Empty if the next character is not unique.
    std::string forced_text(size_t max_chars);
    // Whether the grammar allows this token here.
    bool allows(llama_token token);
    // Advances the grammar by a token (which must be allowed); counts down the budget.
    void accept(llama_token token);
    // Advances the grammar by part of a token's text (a lazy grammar's start: the text from its
    // trigger on, methods/grammar-trigger), as llama.cpp's lazy sampler does; no budget spent.
    // False if the grammar does not take it: then it allows nothing more.
    bool accept_text(llama_token token, const std::string & text);

    // Ending within a budget (schema_fit_max_tokens, methods/grammar-budget): with `tokens`
    // left for the output, best() and top_allowed() take only tokens after which the grammar can
    // still end in time. A pick changes only when after the model's choice the shortest
    // completion has more characters than tokens are left. When no allowed token fits (a budget
    // too small from the start), the budget is dropped. llama_opt_grammar_budget::none: none.
    void set_budget(size_t tokens);

    uint64_t check_ns() const { return check_ns_; }  // time spent in best/top_allowed/forced
    uint64_t budget_picks() const { return budget_.picks(); }  // picks the budget changed

private:
    llama_opt_grammar(std::shared_ptr<llama_opt_grammar_vocab> vocab, llama_grammar * grammar, uint64_t text_hash);
    // llama.cpp's parse of a GBNF grammar; throws as the constructor says
    static llama_grammar * parse(const llama_opt_grammar_vocab & vocab, const std::string & gbnf, const std::string & root);

    std::shared_ptr<llama_opt_grammar_vocab> vocab_;
    llama_grammar *                          grammar_;
    int32_t                                  n_vocab_;
    uint64_t                                 text_hash_;  // the grammar's identity in state keys
    uint64_t                                 check_ns_ = 0;
    llama_opt_grammar_budget                 budget_;

    // adds the time until it goes out of scope to check_ns_
    struct check_timer {
        uint64_t &                            total;
        std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
        ~check_timer() {
            total += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
        }
    };

    uint64_t state_key() const;  // the grammar state, independent of this object's addresses
    // Which of `ids` the grammar allows, in the order given.
    std::vector<llama_token> allowed(const llama_token * ids, size_t n) const;
    llama_opt_grammar_vocab::token_list allowed_here();  // all allowed tokens, remembered per state
    std::vector<llama_token> ranked(const float * logits, size_t k) const;  // top k ids by logit
    std::vector<llama_token> candidates() const;  // a superset of the allowed tokens, often small
    std::vector<llama_token> all_tokens() const;
};

// The specification's interface (000 §1.5), over a parsed grammar.
struct llama_opt_skip_result {
    bool        can_skip     = false;  // the grammar allows exactly one token here
    llama_token forced_token = -1;     // that token
    bool        dead_end     = false;  // the grammar allows no token here
};

struct llama_opt_skip_sequence {
    std::vector<llama_token> tokens;      // forced one after another from here
    uint32_t                 n_skip = 0;  // tokens.size()
};

llama_opt_skip_result   llama_opt_schema_query_next(llama_opt_grammar & grammar);
// Looks ahead at most max_lookahead tokens; the grammar itself does not move.
llama_opt_skip_sequence llama_opt_schema_query_sequence(llama_opt_grammar & grammar, uint32_t max_lookahead);
