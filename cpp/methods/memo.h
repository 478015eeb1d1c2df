#pragma once

// memo: output that repeats earlier output (a file quoted back, a tool call's arguments, a line
// of the previous answer, another agent's answer to the same task). Instead of the
// specification's trie of hidden-state hashes, the draft is what followed the latest earlier
// occurrence of the history's last tokens in the session's own history (prompt, tool results,
// earlier answers) or in the recent outputs of the context's sessions. The session checks a draft in
// one batch whose rows compute exactly like one-token decode steps (patches/0006) and keeps the
// drafted tokens its sampler picks anyway, so the output is the one of plain decoding (Tier 1).

#include "base/numerics.h"
#include "base/types.h"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

// A checked token costs about half a decode step (its row of a batch: the 262k-entry output
// layer dominates), so drafts are kept short unless the repetition is long: a draft needs a
// match of at least LLAMA_OPT_MEMO_MATCH_MIN tokens and is as long as the match, up to
// LLAMA_OPT_MEMO_MATCH_MAX (base/numerics.h). On the agent trace this policy beat fixed lengths
// 2/4/8 and thresholds 1-4 (docs/memo.md).
constexpr uint32_t LLAMA_OPT_MEMO_MATCH_MIN = 2;

struct llama_opt_memo_draft {
    uint32_t                 match = 0;       // tokens of the history's suffix matched earlier (0: none)
    std::vector<llama_token> tokens;          // what followed that earlier occurrence (empty: no draft)
    bool                     shared = false;  // found in the context's recent outputs, not in the history
};

// The draft after history[0, n): what followed the most recent earlier occurrence of the
// history's longest suffix (up to LLAMA_OPT_MEMO_MATCH_MAX tokens) that occurred before,
// min(match, max_tokens) tokens of it; none for a match shorter than LLAMA_OPT_MEMO_MATCH_MIN.
llama_opt_memo_draft llama_opt_memo_find(const llama_token * history, size_t n, uint32_t max_tokens);

// The recent outputs of a context's sessions, each with the tokens just before it (so that a
// history ending like the prompt that led to it matches from its first token): drafts for
// sessions whose own history does not hold the repetition — agents given the same task, a
// request sent again, an answer whose text a re-rendered history dropped. Bounded: the oldest
// outputs go first.
class llama_opt_memo_outputs {
public:
    // Tokens kept at most, and outputs: a draft search reads them all before each step (~1 ns a token).
    static constexpr size_t capacity_tokens  = 16384;
    static constexpr size_t capacity_outputs = 256;

    // An output: its tokens follow `lead_in` (only its last LLAMA_OPT_MEMO_MATCH_MAX are kept).
    void add(const llama_token * lead_in, size_t n_lead_in, const llama_token * output, size_t n_output);
    // Replaces `draft` (found in the history itself) by what followed the latest occurrence in
    // an output of a longer suffix of history[0, n), if there is one.
    void improve(const llama_token * history, size_t n, uint32_t max_tokens, llama_opt_memo_draft & draft) const;
    size_t size() const { return outputs_.size(); }
    size_t n_tokens() const { return n_tokens_; }
    void   clear();

private:
    std::deque<std::vector<llama_token>> outputs_;  // oldest first, lead-in included
    size_t                               n_tokens_ = 0;
};

// A draft being checked in a session: the drafted tokens, the logits of the batch rows that
// checked them (row i: after the pending token and i drafted tokens), and how many of them
// sampling has confirmed. The cells of drafted tokens not yet confirmed lie beyond the
// session's history until the check ends.
class llama_opt_memo_check {
public:
    // The buffer the check's batch writes its rows' logits to, before start().
    std::vector<float> & rows() { return rows_; }
    void start(std::vector<llama_token> draft, size_t n_vocab, bool shared = false) {
        draft_   = std::move(draft);
        shared_  = shared;
        next_    = 0;
        n_vocab_ = n_vocab;
    }
    bool active() const { return next_ < draft_.size(); }
    bool shared() const { return shared_; }  // the draft came from the context's recent outputs
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
    bool                     shared_  = false;
    size_t                   next_    = 0;  // the next drafted token to confirm
    size_t                   n_vocab_ = 0;
    std::vector<float>       rows_;
};
