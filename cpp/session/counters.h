#pragma once

// session/counters: a session's statistics. Each count goes to the session's own
// statistics and to its context's, which add up every session (closed ones too) and the
// context's own work (evictions, batches of several sessions).

#include "engine/context.h"
#include "base/stats.h"

// Runs `body`, then `after`, also when `body` throws (work done before a failure was thrown away,
// but done: the statistics count it).
template <class Body, class After> void llama_opt_finally(Body && body, After && after) {
    try {
        body();
    } catch (...) {
        after();
        throw;
    }
    after();
}

class llama_opt_session_counters {
public:
    explicit llama_opt_session_counters(llama_opt_context & ctx) : ctx_(ctx) {}

    void count(uint64_t llama_opt_stats::* counter, uint64_t n) {
        stats_.*counter += n;
        ctx_.count(counter, n);
    }
    void count_work(uint64_t llama_opt_stats::* counter, const llama_opt_work & work) {
        count(counter, work.tokens);
        count(&llama_opt_stats::forward_passes, work.passes);
        count(&llama_opt_stats::forward_us, work.us);
    }
    // The session's share of work its context counted already (a batch of several sessions).
    void count_share(uint64_t llama_opt_stats::* counter, const llama_opt_work & work) {
        stats_.*counter += work.tokens;
        stats_.forward_passes += work.passes;
        stats_.forward_us += work.us;
    }

    const llama_opt_stats & stats() const { return stats_; }
    // The counts since the last turn ended; the next turn starts now.
    llama_opt_stats end_turn() {
        const llama_opt_stats turn = stats_ - turn_start_;
        turn_start_ = stats_;
        return turn;
    }

private:
    llama_opt_context & ctx_;
    llama_opt_stats     stats_;
    llama_opt_stats     turn_start_;
};
