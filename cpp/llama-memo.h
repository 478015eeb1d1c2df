#pragma once

// memo: output that repeats earlier output (a file quoted back, a tool call's arguments, a line
// of the previous answer). Instead of the specification's trie of hidden-state hashes, the
// draft is what followed the latest earlier occurrence of the history's last tokens in the
// session's own history (prompt, tool results, earlier answers). The session checks a draft in
// one batch whose rows compute exactly like one-token decode steps (patches/0006) and keeps the
// drafted tokens its sampler picks anyway, so the output is the one of plain decoding (Tier 1).

#include "llama-opt.h"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

// A checked token costs about half a decode step (its row of a batch: the 262k-entry output
// layer dominates), so drafts are kept short unless the repetition is long: a draft needs a
// match of at least LLAMA_OPT_MEMO_MATCH_MIN tokens and is as long as the match, up to
// LLAMA_OPT_MEMO_MATCH_MAX (llama-opt.h). On the agent trace this policy beat fixed lengths
// 2/4/8 and thresholds 1-4 (docs/memo.md).
constexpr uint32_t LLAMA_OPT_MEMO_MATCH_MIN = 2;

struct llama_opt_memo_draft {
    uint32_t                 match = 0;  // tokens of the history's suffix matched earlier (0: none)
    std::vector<llama_token> tokens;     // what followed that earlier occurrence (empty: no draft)
};

// The draft after history[0, n): what followed the most recent earlier occurrence of the
// history's longest suffix (up to LLAMA_OPT_MEMO_MATCH_MAX tokens) that occurred before,
// min(match, max_tokens) tokens of it; none for a match shorter than LLAMA_OPT_MEMO_MATCH_MIN.
llama_opt_memo_draft llama_opt_memo_find(const llama_token * history, size_t n, uint32_t max_tokens);

// A draft being checked in a session: the drafted tokens, the logits of the batch rows that
// checked them (row i: after the pending token and i drafted tokens), and how many of them
// sampling has confirmed. The cells of drafted tokens not yet confirmed lie beyond the
// session's history until the check ends.
class llama_opt_memo_check {
public:
    // The buffer the check's batch writes its rows' logits to, before start().
    std::vector<float> & rows() { return rows_; }
    void start(std::vector<llama_token> draft, size_t n_vocab) {
        draft_   = std::move(draft);
        next_    = 0;
        n_vocab_ = n_vocab;
    }
    bool active() const { return next_ < draft_.size(); }
    const float * row(size_t i) const { return rows_.data() + i * n_vocab_; }
    // `token` joined the history. If it is the next drafted token it is confirmed, and the
    // logits after it are returned (its KV came with the check); otherwise nullptr, and the
    // caller ends the check.
    const float * confirm(llama_token token) {
        if (!active() || token != draft_[next_]) {
            return nullptr;
        }
        ++next_;
        return row(next_);
    }
    void clear() {
        draft_.clear();
        next_ = 0;
    }
    void release() {  // end of a generation: the rows' memory too
        clear();
        std::vector<float>().swap(rows_);
    }

private:
    std::vector<llama_token> draft_;
    size_t                   next_    = 0;  // the next drafted token to confirm
    size_t                   n_vocab_ = 0;
    std::vector<float>       rows_;
};
