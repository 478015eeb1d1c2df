#include "methods/memo.h"

#include <algorithm>

namespace {

// The longest match (up to LLAMA_OPT_MEMO_MATCH_MAX) of a suffix of history[0, n) that ends
// at text[i] for some i < n_ends, the latest of equally long ones; better than `match` only.
// Sets match and best_end (one past text's matched tokens) when it finds a better one.
void find_suffix(const llama_token * text, size_t n_ends, const llama_token * history, size_t n, uint32_t & match,
                 size_t & best_end) {
    if (n == 0 || match >= LLAMA_OPT_MEMO_MATCH_MAX) {
        return;
    }
    const llama_token last = history[n - 1];
    // newest first, so that of equally long matches the most recent wins
    for (size_t i = n_ends; i-- > 0;) {
        if (text[i] != last) {
            continue;
        }
        uint32_t len = 1;
        while (len < LLAMA_OPT_MEMO_MATCH_MAX && len <= i && len < n && text[i - len] == history[n - 1 - len]) {
            ++len;
        }
        if (len > match) {
            match    = len;
            best_end = i + 1;
            if (len == LLAMA_OPT_MEMO_MATCH_MAX) {
                return;
            }
        }
    }
}

// what followed the match in text[0, n_text): min(match, max_tokens) tokens at most
void take_draft(const llama_token * text, size_t n_text, size_t best_end, uint32_t max_tokens,
                llama_opt_memo_draft & draft) {
    draft.tokens.clear();
    if (draft.match >= LLAMA_OPT_MEMO_MATCH_MIN) {
        const size_t stop = std::min(n_text, best_end + std::min(draft.match, max_tokens));
        draft.tokens.assign(text + best_end, text + stop);
    }
}

}  // namespace

llama_opt_memo_draft llama_opt_memo_find(const llama_token * history, size_t n, uint32_t max_tokens) {
    llama_opt_memo_draft draft;
    if (n < 2 || max_tokens == 0) {
        return draft;
    }
    size_t best_end = 0;
    find_suffix(history, n - 1, history, n, draft.match, best_end);  // earlier occurrences only
    take_draft(history, n, best_end, max_tokens, draft);
    return draft;
}

void llama_opt_memo_outputs::add(const llama_token * lead_in, size_t n_lead_in, const llama_token * output,
                                 size_t n_output) {
    if (n_output == 0) {
        return;
    }
    const size_t kept_lead_in = std::min<size_t>(n_lead_in, LLAMA_OPT_MEMO_MATCH_MAX);
    std::vector<llama_token> entry(lead_in + n_lead_in - kept_lead_in, lead_in + n_lead_in);
    entry.insert(entry.end(), output, output + std::min(n_output, capacity_tokens - kept_lead_in));
    n_tokens_ += entry.size();
    outputs_.push_back(std::move(entry));
    while (n_tokens_ > capacity_tokens || outputs_.size() > capacity_outputs) {
        n_tokens_ -= outputs_.front().size();
        outputs_.pop_front();
    }
}

void llama_opt_memo_outputs::improve(const llama_token * history, size_t n, uint32_t max_tokens,
                                     llama_opt_memo_draft & draft) const {
    if (max_tokens == 0) {
        return;
    }
    uint32_t match = draft.match;
    const std::vector<llama_token> * best = nullptr;
    size_t best_end = 0;
    for (auto it = outputs_.rbegin(); it != outputs_.rend(); ++it) {  // newest first
        const uint32_t before = match;
        // an occurrence at an output's last token has nothing after it to draft
        find_suffix(it->data(), it->size() - 1, history, n, match, best_end);
        if (match > before) {
            best = &*it;
        }
    }
    if (best && match >= LLAMA_OPT_MEMO_MATCH_MIN) {
        draft.match  = match;
        draft.shared = true;
        take_draft(best->data(), best->size(), best_end, max_tokens, draft);
    }
}

void llama_opt_memo_outputs::clear() {
    outputs_.clear();
    n_tokens_ = 0;
}
