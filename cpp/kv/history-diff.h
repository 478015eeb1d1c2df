#pragma once

// kv/history-diff: what changed between two token histories, as KEEP / INSERT / DELETE /
// REPLACE spans. The common cases (append-only, one edit) cost one linear pass; other edits
// are matched block by block (content hash of block_size tokens, verified token by token),
// each match extended to the whole run of equal tokens, and the runs taken longest first.
//
// Exactness note: KV after a changed token depends on the change, so only a KEEP span at
// the start (the common prefix) can be reused exactly; later KEEP spans are Tier 2.

#include "base/types.h"

#include <vector>

enum llama_opt_diff_op { DIFF_KEEP, DIFF_INSERT, DIFF_DELETE, DIFF_REPLACE };

struct llama_opt_diff_span {
    llama_opt_diff_op op;
    uint32_t          prev_start;
    uint32_t          prev_length;  // 0 for INSERT
    uint32_t          curr_start;
    uint32_t          curr_length;  // 0 for DELETE; equal to prev_length for KEEP
};

using llama_opt_diff_result = std::vector<llama_opt_diff_span>;

class llama_opt_diff_engine {
public:
    // KEEP spans shorter than min_unchanged (other than the common prefix) are folded into
    // the neighbouring change: not worth the bookkeeping of reusing them.
    explicit llama_opt_diff_engine(uint32_t block_size, uint32_t min_unchanged = 1);

    // Spans cover prev and curr exactly once each, in order.
    llama_opt_diff_result compute(const llama_token * prev, uint32_t n_prev,
                                  const llama_token * curr, uint32_t n_curr) const;

    // Tokens compared or hashed by the last compute(): the complexity check of the tests.
    uint64_t last_work() const { return work_; }

private:
    uint32_t         block_size_;
    uint32_t         min_unchanged_;
    mutable uint64_t work_ = 0;

    // KEEP spans of equal tokens inside prev[p0, p1) x curr[c0, c1), in increasing order.
    void match_blocks(const llama_token * prev, uint32_t p0, uint32_t p1,
                      const llama_token * curr, uint32_t c0, uint32_t c1,
                      llama_opt_diff_result & keeps) const;
};

// Length of the KEEP span at the start of both histories (0 if none).
uint32_t llama_opt_diff_common_prefix(const llama_opt_diff_result & diff);

// Tokens in KEEP spans.
uint32_t llama_opt_diff_kept(const llama_opt_diff_result & diff);

// The last two recorded histories of a context: diff the current turn against the previous.
class llama_opt_context_history {
public:
    void                record(const llama_token * tokens, uint32_t n_tokens);  // becomes current
    const llama_token * curr_tokens() const { return curr_.data(); }
    uint32_t            curr_n_tokens() const { return (uint32_t) curr_.size(); }
    const llama_token * prev_tokens() const { return prev_.data(); }
    uint32_t            prev_n_tokens() const { return (uint32_t) prev_.size(); }
    bool                has_prev() const { return has_prev_; }
    void                clear();

private:
    std::vector<llama_token> prev_, curr_;
    bool                     has_prev_ = false;
    bool                     has_curr_ = false;
};
