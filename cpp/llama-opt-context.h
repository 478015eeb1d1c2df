#pragma once

// llama-opt-context: one llama_context with a unified KV cache shared by many sessions
// (one sequence id each). It computes KV for token spans of a sequence and counts the work.

#include "llama-opt-model.h"
#include "llama-opt.h"

#include <memory>
#include <mutex>
#include <vector>

struct llama_context;
class llama_opt_session;

struct llama_opt_context_params {
    uint32_t n_ctx           = 4096;  // KV cells shared by all sessions
    uint32_t n_batch         = 512;   // tokens per llama_decode call (= one ubatch, see below)
    uint32_t n_seq_max       = 8;     // sessions open at once
    int32_t  n_threads       = 0;     // 0 = all hardware threads
    int32_t  n_threads_batch = 0;     // 0 = n_threads
    bool     flash_attn      = true;  // fixed per context: numerics depend on it
    bool     swa_full        = true;  // keep every token of sliding-window layers (prefix reuse needs them)
};

class llama_opt_context : public std::enable_shared_from_this<llama_opt_context> {
public:
    llama_opt_context(std::shared_ptr<llama_opt_model> model, const llama_opt_context_params & params,
                      const llama_opt_settings & settings);
    ~llama_opt_context();

    llama_opt_context(const llama_opt_context &)             = delete;
    llama_opt_context & operator=(const llama_opt_context &) = delete;

    // Throws llama_opt_error(context_overflow) when n_seq_max sessions are open.
    std::shared_ptr<llama_opt_session> open_session();

    // Frees the llama context; open sessions become closed.
    void close();
    bool closed() const { return ctx_ == nullptr; }

    const llama_opt_model &    model() const { return *model_; }
    const llama_opt_settings & settings() const { return settings_; }
    const llama_opt_context_params & params() const { return params_; }
    uint32_t n_ctx() const { return n_ctx_; }
    uint32_t n_sessions() const;

    llama_opt_stats stats() const;
    void            reset_stats();

private:
    friend class llama_opt_session;

    // Computes KV for tokens[begin, end) of `seq` at positions begin..end-1, in chunks of at
    // most n_batch tokens; copies the logits of the last token into `logits`. On failure the
    // KV of [begin, end) is removed again and llama_opt_error is thrown.
    void decode(int32_t seq, const std::vector<llama_token> & tokens, size_t begin, size_t end,
                std::vector<float> & logits, llama_opt_stats & session_stats, uint64_t llama_opt_stats::* counter);

    // Adds n to a counter of both the session's and the context's statistics.
    void count(llama_opt_stats & session_stats, uint64_t llama_opt_stats::* counter, uint64_t n);

    void forget(int32_t seq, size_t from);  // removes the KV of positions >= from
    void release(int32_t seq);              // frees a sequence's KV and id
    void check_open() const;

    std::shared_ptr<llama_opt_model>              model_;
    llama_opt_context_params                      params_;
    llama_opt_settings                            settings_;
    llama_context *                               ctx_   = nullptr;
    uint32_t                                      n_ctx_ = 0;
    std::vector<std::weak_ptr<llama_opt_session>> sessions_;  // by sequence id
    llama_opt_stats                               stats_;
    mutable std::mutex                            mutex_;     // a llama_context is not thread-safe
};
