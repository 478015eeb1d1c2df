#pragma once

// session/prefill: how a session's new tokens get their KV. On the canonical schedule,
// what is not canonical is computed again, and a longer prefix is first taken from other
// sequences and the disk tier (session/reuse) and the room found before anything is
// computed (session/room); then the tokens are computed whole, by H2O's chunks (Tier 2,
// docs/h2o.md: a long prompt into an empty session), or only those speculative prefill's scorer
// keeps (Tier 2, specification 001: the others become holes).

#include "session/approx-settings.h"
#include "session/history.h"
#include "session/reuse.h"
#include "session/room.h"

class llama_opt_session_prefill {
public:
    llama_opt_session_prefill(llama_opt_session_history & history, llama_opt_session_counters & counters,
                              const llama_opt_approx_settings & approx, llama_opt_session_reuse & reuse,
                              llama_opt_session_room & room)
        : history_(history), counters_(counters), approx_(approx), reuse_(reuse), room_(room) {}

    // Adds tokens to the history and computes their KV; on error the history is unchanged.
    void append(const std::vector<llama_token> & tokens);
    // Computes the history's tokens without KV, the work counted in `counter`.
    void prefill(uint64_t llama_opt_stats::* counter);
    // prefill(), and on failure cuts the history back to `keep` tokens (npos: the tokens whose KV
    // exists) before rethrowing.
    void prefill_or_cut_back(size_t keep);
    // The logits after the last token: the tokens without KV computed, the end of a history that was
    // cut back computed again.
    void ensure_logits(uint64_t llama_opt_stats::* counter);
    // Sets the history to `tokens`, every one computed afresh from position 0 on the schedule
    // (nothing reused, no Tier-2 prefill), every row's logits handed to `each_row`: the rows of a
    // prompt, as a context that never saw it computes them. The KV is the canonical one (its blocks
    // join the pool); the logits after the last token are not kept (the next step computes the
    // last chunk again, as after a cut: those rows' outputs came from a product of another size).
    // On error the history is empty.
    void compute_afresh(const std::vector<llama_token> & tokens, const llama_opt_row_logits & each_row);

private:
    bool uses_h2o(size_t end) const;  // a prompt of more than h2o_chunk_size tokens into a session without KV
    // spec_prefill: computes only the tokens of [n_evaluated, end) its scorer keeps (the rest are
    // holes); false, with nothing computed, when the prompt is computed whole (off, too short,
    // everything kept, or no scores)
    bool spec_prefill(size_t end, uint64_t llama_opt_stats::* counter);

    llama_opt_session_history &       history_;
    llama_opt_session_counters &      counters_;
    const llama_opt_approx_settings & approx_;
    llama_opt_session_reuse &         reuse_;
    llama_opt_session_room &          room_;
};
