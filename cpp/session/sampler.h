#pragma once

// session/sampler: how a session picks its next token: sampling parameters, and a GBNF
// grammar that constrains them. With schema_skip_enabled a token the grammar decides is taken
// without logits (methods/grammar); with schema_jump_forward a forced string is taken as its
// own tokens. Logit biases and repetition penalties adjust the logits first (session/logit-adjust).
// A lazy grammar (with triggers) constrains nothing until a trigger fires (methods/grammar-trigger):
// until then the picks are those of no grammar.

#include "engine/model.h"
#include "base/config.h"
#include "base/types.h"
#include "llama.h"
#include "methods/grammar-trigger.h"
#include "session/logit-adjust.h"

#include <memory>
#include <string>
#include <vector>

class llama_opt_grammar;

struct llama_opt_sampling {
    float    temperature = 0.0f;  // <= 0: greedy
    int32_t  top_k       = 40;    // <= 0: off
    float    top_p       = 0.95f; // >= 1: off
    float    min_p       = 0.05f; // <= 0: off
    uint32_t seed        = LLAMA_DEFAULT_SEED;  // random
    std::vector<llama_logit_bias> logit_bias;      // added to the logits before anything else
    llama_opt_penalties           penalties;       // then the repetition penalties (default: off)
    // per step, the picked token's log-probability and this many alternatives (session/logprobs);
    // -1: none. On, a token the grammar forces is picked from logits too (they are needed).
    int32_t                       logprobs = -1;
};

class llama_opt_sampler {
public:
    // `model` and `config` must outlive the sampler (the session's context holds both).
    llama_opt_sampler(const llama_opt_model & model, const llama_opt_config & config);
    ~llama_opt_sampler();

    llama_opt_sampler(const llama_opt_sampler &)             = delete;
    llama_opt_sampler & operator=(const llama_opt_sampler &) = delete;

    // Throws llama_opt_error(invalid_argument) for a bias or penalty out of range (logit-adjust).
    void set_sampling(const llama_opt_sampling & sampling);
    // A generation starts after `history` (the penalties look back over its end).
    void start_generation(const std::vector<llama_token> & history) { adjust_->start(history); }
    // Throws llama_opt_error(grammar) if `gbnf` does not parse; "": no grammar. max_tokens: the
    // output's budget (0: none), which the grammar keeps to with schema_fit_max_tokens. With
    // `triggers` the grammar is lazy: it starts when one of them fires. `prefill`: text the grammar
    // takes before the output (prefill_grammar); throws llama_opt_error(grammar) if it does not take
    // it, llama_opt_error(invalid_argument) with triggers (llama.cpp prefills no lazy grammar).
    void set_grammar(const std::string & gbnf, uint32_t max_tokens = 0,
                     const std::vector<llama_opt_grammar_trigger> & triggers = {},
                     const std::string & prefill = "");
    // a grammar constrains the next pick (a lazy one only once triggered)
    bool constrained() const { return grammar_ != nullptr && awaiting_ == nullptr; }
    bool has_grammar() const { return grammar_ != nullptr; }

    // The next token the grammar decides, to be taken without logits: -1 when the model must
    // choose, -2 when the grammar allows nothing. Only with a grammar.
    llama_token next_inferred();
    // Tokens the grammar already decided are queued: the next one needs no logits.
    bool has_inferred() const { return !inferred_queue_.empty(); }
    // The token picked from `logits` (n_vocab of them); -1 if the grammar allows none.
    llama_token pick(const std::vector<float> & logits);
    // A token joined the history: the grammar and the sampler chain advance past it.
    void accept(llama_token token);
    // The generation is over: drops its grammar; returns what it cost.
    struct grammar_report {
        uint64_t check_us     = 0;  // time its checks took
        uint64_t budget_picks = 0;  // picks the budget changed (schema_fit_max_tokens)
    };
    grammar_report end_generation();

private:
    llama_token sample_allowed(const float * logits);  // seeded sampling under the grammar (adjusted logits)
    void        queue_jump_forward();                  // a forced string's own tokens, into inferred_queue_
    void        watch_trigger(llama_token token);      // a lazy grammar's wait: starts it when `token` fires a trigger
    void        prefill_grammar(llama_opt_grammar & grammar, const std::string & text) const;

    const llama_opt_model &            model_;
    const llama_opt_config &           config_;
    llama_sampler *                    chain_  = nullptr;
    bool                               greedy_ = true;  // argmax directly, no candidate array
    int32_t                            top_k_  = 40;
    std::unique_ptr<llama_opt_logit_adjust> adjust_;
    std::unique_ptr<llama_opt_grammar> grammar_;
    std::unique_ptr<llama_opt_grammar_trigger_watch> awaiting_;  // a lazy grammar not started yet
    uint32_t                           budget_   = 0;  // set_grammar's max_tokens with schema_fit_max_tokens (0: none)
    uint32_t                           n_awaited_ = 0;  // tokens taken before a lazy grammar started
    bool                               dead_end_  = false;  // it started on text it does not take: it allows nothing
    std::vector<llama_token>           inferred_queue_;  // decided tokens still to take, last first
    std::vector<llama_token_data>      candidates_;      // sampling scratch, reused per step
};
