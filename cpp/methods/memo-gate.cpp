#include "methods/memo-gate.h"

#include <algorithm>

uint32_t llama_opt_memo_gate::draft_length(uint32_t match, uint32_t max_tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    max_tokens = std::min(max_tokens, LLAMA_OPT_MEMO_MATCH_MAX);
    if (step_us_ == 0) {
        return max_tokens;  // nothing to price a row by yet
    }
    const uint32_t length = length_of(match);
    const double   row    = row_steps_locked();
    // the i-th token saves a step with the chance that it and every one before it are confirmed
    // (falling with i), and costs a row: check while that chance outweighs the row
    uint32_t n        = 0;
    double   all_yes  = 1;
    while (n < max_tokens) {
        all_yes *= chance_locked(length, n + 1);
        if (all_yes <= row) {
            break;
        }
        ++n;
    }
    if (n < max_tokens && ++since_probe_[length] >= probe_every) {
        since_probe_[length] = 0;
        ++n;  // measure the first place the pricing cut
    }
    return n;
}

void llama_opt_memo_gate::step(uint64_t us) {
    std::lock_guard<std::mutex> lock(mutex_);
    step_us_ = step_us_ == 0 ? (double) us : 0.9 * step_us_ + 0.1 * (double) us;
}

void llama_opt_memo_gate::fade(places & p) {
    for (tally & t : p) {
        t.compared *= decay;
        t.confirmed *= decay;
    }
}

void llama_opt_memo_gate::checked(uint32_t match, uint32_t n_drafted, double added_us) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (step_us_ == 0 || n_drafted == 0) {
        return;  // nothing to price it by yet
    }
    row_cost_ = decay * row_cost_ + std::clamp(added_us / step_us_, 0.0, (double) n_drafted);
    rows_     = decay * rows_ + n_drafted;
    fade(by_match_[length_of(match)]);
    fade(all_);
}

void llama_opt_memo_gate::compared(uint32_t match, uint32_t place, bool confirmed) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (place == 0 || place > LLAMA_OPT_MEMO_MATCH_MAX) {
        return;
    }
    for (places * p : { &by_match_[length_of(match)], &all_ }) {
        (*p)[place].compared += 1;
        (*p)[place].confirmed += confirmed;
    }
}

double llama_opt_memo_gate::row_steps_locked() const {
    return (row_cost_ + prior_row) / (rows_ + 1);
}

double llama_opt_memo_gate::chance_locked(uint32_t length, uint32_t place) const {
    const tally & all    = all_[place];
    const double  pooled = (all.confirmed + 2 * prior_yes) / (all.compared + 2);
    const tally & own    = by_match_[length][place];
    return (own.confirmed + shrink * pooled) / (own.compared + shrink);
}

double llama_opt_memo_gate::step_us() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return step_us_;
}

double llama_opt_memo_gate::row_steps() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return row_steps_locked();
}

double llama_opt_memo_gate::chance(uint32_t match, uint32_t place) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return chance_locked(length_of(match), std::clamp<uint32_t>(place, 1, LLAMA_OPT_MEMO_MATCH_MAX));
}
