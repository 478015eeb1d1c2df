#include "methods/memo-gate.h"

#include <algorithm>

bool llama_opt_memo_gate::open(uint32_t match) {
    std::lock_guard<std::mutex> lock(mutex_);
    weighed & w = by_match_[length_of(match)];
    if (step_us_ == 0 || w.saved_us >= w.cost_us || ++w.refused >= probe_every) {
        w.refused = 0;
        return true;
    }
    return false;
}

void llama_opt_memo_gate::step(uint64_t us) {
    std::lock_guard<std::mutex> lock(mutex_);
    step_us_ = step_us_ == 0 ? (double) us : 0.9 * step_us_ + 0.1 * (double) us;
}

void llama_opt_memo_gate::checked(uint32_t match, uint32_t n_drafted, double added_us) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (step_us_ == 0) {
        return;  // nothing to price it by yet
    }
    const double added = std::clamp(added_us, 0.0, n_drafted * step_us_);
    weighed &    w     = by_match_[length_of(match)];
    w.cost_us          = decay * w.cost_us + added;
    w.saved_us         = decay * w.saved_us;
}

void llama_opt_memo_gate::confirmed(uint32_t match) {
    std::lock_guard<std::mutex> lock(mutex_);
    by_match_[length_of(match)].saved_us += step_us_;
}

double llama_opt_memo_gate::step_us() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return step_us_;
}
