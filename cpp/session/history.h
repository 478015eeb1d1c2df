#pragma once

// session/history: the token history of one sequence and the account of its KV, kept
// true by the operations below, which move its fields together:
//
//   tokens_[0, n_evaluated_) have KV in the memory, but the holes (Tier 2: positions whose KV left
//   attention); tokens_[0, n_canonical_) form complete blocks computed by the canonical schedule
//   (or shared from a sequence that computed them so), named by chain_; KV of positions >=
//   approx_from_ is approximate (Tier 2). While a memo draft is checked, its cells lie past
//   n_evaluated_. The logits follow token logits_for_ - 1.
//
// The partial last block and generated tokens (decoded one at a time, a different kernel path)
// are computed again before the history grows past them. Callers hold the context's mutex.

#include "methods/memo.h"
#include "engine/context.h"
#include "session/counters.h"
#include "llama.h"

#include <functional>
#include <utility>
#include <vector>

using llama_opt_span = std::pair<size_t, size_t>;  // positions [first, second)

// [a, b) into a sorted list of disjoint spans, merged with those it touches
void llama_opt_spans_add(std::vector<llama_opt_span> & spans, size_t a, size_t b);
// removes [a, b) from a sorted list of disjoint spans
void llama_opt_spans_subtract(std::vector<llama_opt_span> & spans, size_t a, size_t b);

// Where computing up to `end` may start at the latest: the last chunk must hold at least
// min_chunk() tokens (it computes the logits of the last token) and start at a multiple of
// row_align().
size_t llama_opt_reusable_prefix(size_t end, const llama_opt_context & ctx);

class llama_opt_session_history {
public:
    static constexpr size_t npos = (size_t) -1;

    llama_opt_session_history(llama_opt_context & ctx, llama_opt_session_counters & counters);

    void                attach(int32_t seq) { seq_ = seq; }
    int32_t             seq() const { return seq_; }
    llama_opt_context & ctx() const { return ctx_; }
    // Called with `pos` when the KV from `pos` on leaves (attention pruning's cold blocks follow).
    void                follow_cuts(std::function<void(size_t)> follower) { follow_cuts_ = std::move(follower); }

    // --- tokens ---
    const std::vector<llama_token> & tokens() const { return tokens_; }
    size_t size() const { return tokens_.size(); }
    bool   empty() const { return tokens_.empty(); }
    size_t room() const;  // tokens that still fit the context
    void   check_fits(size_t n_tokens) const;  // context_overflow if a history of n_tokens would not fit
    void   append(const std::vector<llama_token> & tokens) { tokens_.insert(tokens_.end(), tokens.begin(), tokens.end()); }
    void   push(llama_token token) { tokens_.push_back(token); }
    void   assign(const std::vector<llama_token> & tokens) { tokens_ = tokens; }
    void   cut_tokens(size_t n) { tokens_.resize(n); }  // the tokens from n on leave (their KV must be gone)

    // --- the account of the KV ---
    size_t n_evaluated() const { return n_evaluated_; }
    size_t n_canonical() const { return n_canonical_; }
    size_t approx_from() const { return approx_from_; }
    bool   approximate() const { return approx_from_ != npos; }
    const std::vector<uint64_t> &       chain() const { return chain_; }
    const std::vector<llama_opt_span> & holes() const { return holes_; }
    bool in_hole(size_t pos) const;
    std::vector<llama_opt_span> live_ranges() const;  // [0, n_evaluated_) less the holes

    void computed(size_t end) { n_evaluated_ = end; }  // [0, end) has KV now
    // [0, end) was computed on the canonical schedule: canonical but the rows of the last, incomplete
    // group of row_align(), and a whole history shorter than min_chunk() (it was one small chunk)
    void computed_canonically(size_t end);
    // The chained hashes of the complete canonical blocks that have none yet; returns the first new one.
    size_t hash_new_blocks();
    // [0, n) is a canonical prefix: read from the disk tier, or (with the hashes of its blocks)
    // shared from another sequence into a history without KV
    void   restored(size_t n) { n_evaluated_ = n_canonical_ = n; }
    void   adopt_blocks(const std::vector<uint64_t> & hashes);
    void   mark_approximate_from(size_t pos) { approx_from_ = pos; }
    // Removes the KV of positions >= pos (the draft's too); inside a shared prefix the cut moves down
    // to a block boundary. What is left is exact if the cut reaches the approximate KV.
    void   drop_kv_from(size_t pos);
    // The context took the sequence's KV (eviction): nothing has KV any more.
    void   lose_kv();
    // Tier 2: the KV of [p0, p1) leaves attention (a hole); approximate from p0, logits to compute again.
    void   drop_kv(size_t p0, size_t p1);
    void   refill(size_t p0, size_t p1);  // the KV of a hole's [p0, p1) is back
    // Tier-2 sync's failure: the spans that joined above n_evaluated_ leave, with the tokens past them.
    void   drop_joined_spans();
    // `fork`, a new history, takes this one's tokens and shares its complete blocks (canonical), or
    // everything computed (llama.cpp's schedule).
    void   fork_to(llama_opt_session_history & fork) const;

    // --- compute (counted) ---
    // tokens_[begin, end) (llama_opt_context::compute_span), with the logits of the last if `logits`,
    // every row's to `each_row` if given
    void compute(size_t begin, size_t end, uint64_t llama_opt_stats::* counter, bool evict_sessions, bool logits = true,
                 const llama_opt_row_logits & each_row = nullptr);
    // Tier 2: tokens_[p] for each of `positions` (llama_opt_context::compute_positions), with the
    // logits of the last
    void compute_at(const std::vector<size_t> & positions, uint64_t llama_opt_stats::* counter, bool evict_sessions);
    // H2O (docs/h2o.md): tokens_[0, end) by H2O's chunks (llama_opt_h2o_prefill)
    void compute_h2o(size_t end);

    // --- logits ---
    const std::vector<float> & logits() const { return logits_; }
    bool logits_current() const { return logits_for_ == n_evaluated_; }  // they follow the last token with KV
    void take_logits(const float * logits);  // of the last token with KV
    void clear_logits();

    // --- a memo draft being checked (methods/memo.h): its cells lie past n_evaluated_ ---
    std::vector<float> & draft_rows() { return draft_.rows(); }  // the check's batch writes here
    void start_draft(std::vector<llama_token> tokens, bool shared);
    bool draft_active() const { return draft_.active(); }
    bool draft_shared() const { return draft_.shared(); }
    // `token` joined the history: if it is the next drafted one, its KV and the logits after it came
    // with the check (true); else the draft's cells are freed (false)
    bool confirm_draft(llama_token token);
    void drop_draft();     // frees the cells of the drafted tokens not confirmed
    void release_draft();  // the end of a generation: the rows' memory too

    // The specification's INV-1 (003 §2.8): empty if the account is what the memory holds.
    std::string invariant_violation() const;

private:
    llama_opt_context &          ctx_;
    llama_opt_session_counters & counters_;
    int32_t                      seq_ = -1;
    std::function<void(size_t)>  follow_cuts_;
    std::vector<llama_token>     tokens_;
    size_t                       n_evaluated_ = 0;
    size_t                       n_canonical_ = 0;
    size_t                       approx_from_ = npos;
    std::vector<uint64_t>        chain_;  // chained hashes of the canonical blocks
                                          // (the context holds their pool ids: held_blocks)
    std::vector<llama_opt_span>  holes_;  // positions without KV below n_evaluated_ (sorted, disjoint)
    std::vector<float>           logits_;
    size_t                       logits_for_ = 0;
    llama_opt_memo_check         draft_;
};
