#pragma once

// session/decode: a session's generation. Each step computes the pending (last sampled)
// token, samples the next one (session/sampler: sampling, the grammar, grammar-forced tokens
// taken without logits) and leaves it pending. With the memo (docs/memo.md), a step that finds
// the history's end repeated earlier checks the pending token and a draft of what followed in one
// batch whose rows compute like one-token steps (patches/0006); drafted tokens that sampling
// confirms keep their KV (the draft's cells are the history's, session/history).
// Several sessions' steps can be computed in shared batches (prefetch_steps).

#include "session/logprobs.h"
#include "session/sampler.h"
#include "session/prefill.h"

#include <optional>

class llama_opt_session_decode {
public:
    llama_opt_session_decode(llama_opt_session_history & history, llama_opt_session_counters & counters,
                             llama_opt_session_prefill & prefill, llama_opt_session_room & room);

    void set_sampling(const llama_opt_sampling & sampling);
    // the grammar of the following steps; max_tokens: the output's budget (0: none); with
    // triggers, a lazy grammar; prefill: text it takes first (session/sampler)
    void set_grammar(const std::string & gbnf, uint32_t max_tokens,
                     const std::vector<llama_opt_grammar_trigger> & triggers, const std::string & prefill);
    bool generating() const { return generating_; }

    // llama_opt_session::next_token
    llama_token next_token();
    // With sampling.logprobs >= 0: the last next_token()'s log-probabilities (none for -1).
    const std::optional<llama_opt_token_logprob> & last_logprob() const { return last_logprob_; }
    // Computes the pending generated tokens (the last sampled one, any the grammar forced after it).
    void compute_pending();
    // Ends a turn's generation; `open`: the session is (its output joins the context's recent outputs).
    void end_turn(bool open);

    // llama_opt_session::prefetch_steps, over the steps of open sessions of `ctx`.
    static void prefetch_steps(llama_opt_context & ctx, const std::vector<llama_opt_session_decode *> & decoders);

private:
    // memo: a draft for the next step (empty: none found), cut by the gate (methods/memo-gate) to what
    // pays here; nullopt: memo off, or the gate cut it all
    std::optional<llama_opt_memo_draft> find_draft() const;
    bool check_draft();                            // memo: the pending step and a draft in one batch; false: no draft
    void start_draft(llama_opt_memo_draft draft);  // its rows computed: sampling confirms its tokens
    // prefetch_steps: the rows of the next step if it is a decode step (the pending token, then the
    // memo's draft if there is one), appended to `rows`; false if the step is something else
    void add_rows(const llama_opt_memo_draft & draft, std::vector<llama_opt_row> & rows) const;  // the pending token's, the draft's
    bool step_rows(std::vector<llama_opt_row> & rows, std::optional<llama_opt_memo_draft> & draft) const;
    // prefetch_steps: that step computed in a shared batch: its rows' logits, its share of the time
    void take_rows(const float * logits, std::optional<llama_opt_memo_draft> found, uint64_t us);
    void count_draft_hit(bool shared);
    llama_token take(llama_token token);           // a token joins the history
    llama_token take_inferred(llama_token token);  // a token the grammar decided
    void publish_output();  // memo: the turn's output joins the context's recent outputs (memo_shared)

    llama_opt_session_history &  history_;
    llama_opt_session_counters & counters_;
    llama_opt_session_prefill &  prefill_;
    llama_opt_session_room &     room_;
    llama_opt_sampler            sampler_;
    bool                         generating_    = false;  // a turn's generation is on: drafts pay off only then
    size_t                       output_begin_  = 0;      // where the turn's generated tokens begin
    uint32_t                     output_budget_ = 0;      // set_grammar's max_tokens: the most this turn generates
    int32_t                      logprobs_      = -1;     // sampling.logprobs
    uint32_t                     draft_match_   = 0;      // memo: the match the draft being confirmed came from,
    uint32_t                     draft_place_   = 0;      // and how many of its tokens sampling compared so far
    std::optional<llama_opt_token_logprob> last_logprob_;
};
