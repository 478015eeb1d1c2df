#include "session/logprobs.h"

#include "base/types.h"

#include <algorithm>
#include <cmath>
#include <string>

void llama_opt_check_top_logprobs(int32_t top_n) {
    if (top_n < 0 || top_n > LLAMA_OPT_TOP_LOGPROBS_MAX) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "top_logprobs must be between 0 and " + std::to_string(LLAMA_OPT_TOP_LOGPROBS_MAX) + ", got " +
            std::to_string(top_n), "top_logprobs");
    }
}

llama_opt_token_logprob llama_opt_logprob_of(const float * logits, int32_t n_vocab, llama_token token, int32_t top_n) {
    llama_opt_check_top_logprobs(top_n);
    const float max = *std::max_element(logits, logits + n_vocab);
    double sum = 0.0;  // exp in float (the logits' precision), summed in double, in index order
    for (int32_t i = 0; i < n_vocab; ++i) {
        sum += (double) std::exp(logits[i] - max);
    }
    const double log_z = (double) max + std::log(sum);

    // the top_n best in a min-heap of (logit, token): worst on top
    using entry = std::pair<float, llama_token>;
    auto better = [](const entry & a, const entry & b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    std::vector<entry> best;
    best.reserve((size_t) top_n);
    for (int32_t i = 0; i < n_vocab && top_n > 0; ++i) {
        const entry e{ logits[i], i };
        if ((int32_t) best.size() < top_n) {
            best.push_back(e);
            std::push_heap(best.begin(), best.end(), better);
        } else if (better(e, best.front())) {
            std::pop_heap(best.begin(), best.end(), better);
            best.back() = e;
            std::push_heap(best.begin(), best.end(), better);
        }
    }
    std::sort(best.begin(), best.end(), better);

    llama_opt_token_logprob out;
    out.token   = token;
    out.logprob = (double) logits[token] - log_z;
    for (const entry & e : best) {
        out.top.emplace_back(e.second, (double) e.first - log_z);
    }
    return out;
}
