#pragma once

// llama-opt-session: one sequence of a context. An append-only token history (the tokens are
// the contract), the logits after its last evaluated token, and sampling.

#include "llama-opt.h"
#include "llama.h"

#include <memory>
#include <vector>

class llama_opt_context;

struct llama_opt_sampling {
    float    temperature = 0.0f;  // <= 0: greedy
    int32_t  top_k       = 40;    // <= 0: off
    float    top_p       = 0.95f; // >= 1: off
    float    min_p       = 0.05f; // <= 0: off
    uint32_t seed        = LLAMA_DEFAULT_SEED;  // random
};

class llama_opt_session {
public:
    llama_opt_session(std::shared_ptr<llama_opt_context> ctx, int32_t seq);
    ~llama_opt_session();

    llama_opt_session(const llama_opt_session &)             = delete;
    llama_opt_session & operator=(const llama_opt_session &) = delete;

    // Adds tokens to the history and computes their KV. On error (bad token, context
    // overflow, decode failure) the session is left exactly as it was.
    void append(const std::vector<llama_token> & tokens);

    // Sets the history to `tokens`: the KV of the common prefix with the current history is
    // kept, the rest is computed. On a bad token or an overflow the session is unchanged; if
    // computing fails, the history is cut back to the tokens whose KV exists.
    void sync(const std::vector<llama_token> & tokens);

    // Sampler for the following next_token() calls.
    void set_sampling(const llama_opt_sampling & sampling);

    // Computes the KV of a pending (last sampled) token if any, then samples the next token
    // and adds it to the history as pending. Throws context_overflow when the history is full.
    llama_token next_token();

    // Ends a turn: prints the turn's statistics when LLAMA_OPT_STATS is on.
    void end_turn();

    void close();
    bool closed() const;  // closed itself, or its context was closed

    const std::vector<llama_token> & tokens() const { return tokens_; }
    size_t                           n_evaluated() const { return n_evaluated_; }
    size_t                           room() const;  // tokens that still fit the context
    int32_t                          seq() const { return seq_; }
    // Logits after the last token of the history (computed if needed; empty if no history).
    const std::vector<float> &       logits();
    const llama_opt_stats &          stats() const { return stats_; }

private:
    friend class llama_opt_context;

    void check_open() const;
    void check_fits(size_t n_tokens) const;
    void evaluate_pending(uint64_t llama_opt_stats::* counter);
    void ensure_logits(uint64_t llama_opt_stats::* counter);

    std::shared_ptr<llama_opt_context> ctx_;
    int32_t                            seq_;
    bool                               closed_      = false;
    std::vector<llama_token>           tokens_;           // history
    size_t                             n_evaluated_ = 0;  // tokens_[0, n_evaluated_) have KV
    std::vector<float>                 logits_;
    size_t                             logits_for_  = 0;  // logits_ follow token logits_for_ - 1
    llama_sampler *                    sampler_ = nullptr;
    std::vector<llama_token_data>      candidates_;       // sampling scratch, reused per step
    llama_opt_stats                    stats_;
    llama_opt_stats                    turn_start_;
};
