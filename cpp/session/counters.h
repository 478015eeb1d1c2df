#pragma once

// session/counters: a session's statistics, the one place its counts are written. Its context
// follows them (llama_opt_context::follow) and adds up every session's, closed ones' too, with
// the context's own work (evictions, batches of several sessions).

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
    explicit llama_opt_session_counters(llama_opt_context & ctx) : ctx_(ctx) { ctx_.follow(own_); }
    ~llama_opt_session_counters() { ctx_.unfollow(own_); }  // (the context keeps the counts)

    llama_opt_session_counters(const llama_opt_session_counters &)             = delete;
    llama_opt_session_counters & operator=(const llama_opt_session_counters &) = delete;

    void count(uint64_t llama_opt_stats::* counter, uint64_t n) { own_.*counter += n; }
    void count_work(uint64_t llama_opt_stats::* counter, const llama_opt_work & work) {
        count(counter, work.tokens);
        count(&llama_opt_stats::forward_passes, work.passes);
        count(&llama_opt_stats::forward_us, work.us);
    }
    // The session's share of a batch of several sessions' rows, which the context counts whole
    // as its own work: in this session's statistics, not in what the context adds up.
    void count_share(uint64_t llama_opt_stats::* counter, const llama_opt_work & work) {
        shares_.*counter += work.tokens;
        shares_.forward_passes += work.passes;
        shares_.forward_us += work.us;
    }

    llama_opt_stats stats() const {
        llama_opt_stats s = own_;
        return s += shares_;
    }
    // The counts since the last turn ended; the next turn starts now.
    llama_opt_stats end_turn() {
        const llama_opt_stats now  = stats();
        const llama_opt_stats turn = now - turn_start_;
        turn_start_ = now;
        return turn;
    }

private:
    llama_opt_context & ctx_;
    llama_opt_stats     own_;     // followed by the context
    llama_opt_stats     shares_;  // of batches the context counted
    llama_opt_stats     turn_start_;
};
