// llama_opt_grammar, fast masking: the allowed tokens with the highest logits, tried in the
// model's order of preference before the whole allowed set is needed.

#include "methods/grammar.h"

#include <algorithm>

// ids before others: higher logit, then lower id (the order an argmax scan prefers)
static bool ranks_before(const float * logits, llama_token a, llama_token b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

std::vector<llama_token> llama_opt_grammar::ranked(const float * logits, size_t k) const {
    // one pass keeping the k best in order; once there are k, a block of logits none of which
    // beats the k-th is passed over with one vectorized comparison (equal ones rank after it)
    constexpr llama_token block = 64;
    std::vector<llama_token> top;
    top.reserve(k + 1);
    for (llama_token from = 0; from < n_vocab_; from += block) {
        const llama_token to = std::min(n_vocab_, from + block);
        if (top.size() == k) {
            const float bar   = logits[top.back()];
            int         above = 0;
            for (llama_token t = from; t < to; ++t) {
                above |= logits[t] > bar;
            }
            if (!above) {
                continue;
            }
        }
        for (llama_token t = from; t < to; ++t) {
            if (top.size() == k && !ranks_before(logits, t, top.back())) {
                continue;
            }
            auto at = std::upper_bound(top.begin(), top.end(), t,
                                       [logits](llama_token a, llama_token b) { return ranks_before(logits, a, b); });
            top.insert(at, t);
            if (top.size() > k) {
                top.pop_back();
            }
        }
    }
    return top;
}

// The token with the highest logit among `ok` (all allowed), -1 if there is none.
static llama_token best_among(const std::vector<llama_token> & ok, const float * logits) {
    llama_token best = -1;
    for (llama_token t : ok) {
        if (best < 0 || ranks_before(logits, t, best)) {
            best = t;
        }
    }
    return best;
}

// `ids` from the best, by logit
static std::vector<llama_token> by_rank(std::vector<llama_token> ids, const float * logits) {
    std::sort(ids.begin(), ids.end(), [logits](llama_token a, llama_token b) { return ranks_before(logits, a, b); });
    return ids;
}

llama_token llama_opt_grammar::best(const float * logits, bool full_mask) {
    check_timer timer{ check_ns_ };
    llama_token best_allowed = -1;  // ignoring the budget
    if (full_mask) {
        const std::vector<llama_token> ids = all_tokens();
        const std::vector<llama_token> ok = allowed(ids.data(), ids.size());
        best_allowed = best_among(ok, logits);
        if (best_allowed < 0 || !budget_.active() || budget_.fits(best_allowed)) {
            return best_allowed;
        }
        const llama_token t = budget_.first_fitting(by_rank(ok, logits));
        budget_.count_pick(t >= 0);
        return t >= 0 ? t : budget_.give_up(best_allowed);
    }
    // the model usually wants what the grammar allows: try its favourites first, a few at a time
    const std::vector<llama_token> top = ranked(logits, 32);
    for (size_t i = 0; i < top.size(); i += 8) {
        const std::vector<llama_token> ok = allowed(top.data() + i, std::min<size_t>(8, top.size() - i));
        if (!ok.empty() && best_allowed < 0) {
            best_allowed = ok.front();
        }
        const llama_token t = budget_.first_fitting(ok);
        if (t >= 0) {
            budget_.count_pick(t != best_allowed);
            return t;
        }
    }
    // otherwise the best of everything allowed here
    const llama_opt_grammar_vocab::token_list ok = allowed_here();
    if (best_allowed < 0) {
        best_allowed = best_among(*ok, logits);
        if (best_allowed < 0 || budget_.fits(best_allowed)) {
            return best_allowed;
        }
    }
    const llama_token t = budget_.first_fitting(by_rank(*ok, logits));
    budget_.count_pick(t >= 0);
    return t >= 0 ? t : budget_.give_up(best_allowed);
}

std::vector<llama_token_data> llama_opt_grammar::top_allowed(const float * logits, int32_t k, bool full_mask) {
    check_timer timer{ check_ns_ };
    std::vector<llama_token_data> out;
    const auto take = [&](llama_token t) { out.push_back({ t, logits[t], 0.0f }); };
    if (k > 0 && !full_mask) {
        // the model's favourites first, as best() does: when its 256 best tokens hold k allowed
        // ones (that fit), those are the k best allowed, and the whole allowed set is not needed
        const std::vector<llama_token> top      = ranked(logits, 256);
        const std::vector<llama_token> favoured = allowed(top.data(), top.size());
        for (size_t i = 0; i < favoured.size() && out.size() < (size_t) k; ++i) {
            if (budget_.fits(favoured[i])) {
                take(favoured[i]);
            }
        }
        if (out.size() == (size_t) k) {
            budget_.count_pick(out.back().id != favoured[k - 1]);  // the set to sample from changed
            return out;
        }
        out.clear();
    }
    const std::vector<llama_token> all = full_mask ? all_tokens() : std::vector<llama_token>();
    std::vector<llama_token>       ok  = full_mask ? allowed(all.data(), all.size()) : *allowed_here();
    const size_t                   n   = k > 0 ? std::min(ok.size(), (size_t) k) : ok.size();
    // with a budget, the n best that fit are looked for among the best `checked` (top_k's, if more;
    // near the end of a string a few hundred thousand tokens are allowed and a handful fit: the
    // rest carry no probability worth a check); only those are put in order, not all allowed
    constexpr size_t checked = 1024;
    const size_t     scan    = std::min(ok.size(), k > 0 ? std::max(n, checked) : checked);
    const size_t     ordered = budget_.active() ? scan : n;
    std::partial_sort(ok.begin(), ok.begin() + ordered, ok.end(),
                      [logits](llama_token a, llama_token b) { return ranks_before(logits, a, b); });
    if (budget_.active()) {
        for (size_t i = 0; i < scan && out.size() < n; ++i) {
            if (budget_.fits(ok[i])) {
                take(ok[i]);
            }
        }
        if (out.empty()) {  // then the best that fits beyond them, as greedy takes it
            const llama_token t = budget_.first_fitting(by_rank({ ok.begin() + scan, ok.end() }, logits));
            if (t >= 0) {
                take(t);
            } else {
                budget_.give_up(-1);
            }
        }
        if (!out.empty()) {
            budget_.count_pick(out.size() < n || out.back().id != ok[n - 1]);  // the set to sample from changed
            return out;
        }
    }
    for (size_t i = 0; i < n; ++i) {
        take(ok[i]);
    }
    return out;
}
