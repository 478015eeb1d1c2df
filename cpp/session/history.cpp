#include "session/history.h"

#include "kv/block-hash.h"
#include "methods/h2o-prefill.h"

#include <algorithm>
#include <climits>

void llama_opt_spans_add(std::vector<llama_opt_span> & spans, size_t a, size_t b) {
    std::vector<llama_opt_span> out;
    for (const llama_opt_span & s : spans) {
        if (s.second < a || s.first > b) {
            out.push_back(s);
        } else {
            a = std::min(a, s.first);
            b = std::max(b, s.second);
        }
    }
    out.emplace_back(a, b);
    std::sort(out.begin(), out.end());
    spans = std::move(out);
}

void llama_opt_spans_subtract(std::vector<llama_opt_span> & spans, size_t a, size_t b) {
    std::vector<llama_opt_span> out;
    for (const llama_opt_span & s : spans) {
        if (s.first < a) {
            out.emplace_back(s.first, std::min(s.second, a));
        }
        if (s.second > b) {
            out.emplace_back(std::max(s.first, b), s.second);
        }
    }
    spans = std::move(out);
}

size_t llama_opt_reusable_prefix(size_t end, const llama_opt_context & ctx) {
    return end >= ctx.min_chunk() ? (end - ctx.min_chunk()) / ctx.row_align() * ctx.row_align() : 0;
}

llama_opt_session_history::llama_opt_session_history(llama_opt_context & ctx, llama_opt_session_counters & counters)
    : ctx_(ctx), counters_(counters) {}

size_t llama_opt_session_history::room() const {
    return ctx_.n_ctx() > tokens_.size() ? ctx_.n_ctx() - tokens_.size() : 0;
}

void llama_opt_session_history::check_fits(size_t n_tokens) const {
    if (n_tokens > ctx_.n_ctx()) {
        throw llama_opt_error(llama_opt_errc::context_overflow,
            "the session would hold " + std::to_string(n_tokens) + " tokens, more than the context size n_ctx=" +
            std::to_string(ctx_.n_ctx()) + "; start a new session or create the Context with a larger n_ctx", "n_ctx");
    }
}

bool llama_opt_session_history::in_hole(size_t pos) const {
    auto it = std::upper_bound(holes_.begin(), holes_.end(), llama_opt_span(pos, SIZE_MAX));
    return it != holes_.begin() && std::prev(it)->second > pos;
}

std::vector<llama_opt_span> llama_opt_session_history::live_ranges() const {
    std::vector<llama_opt_span> live = { { 0, n_evaluated_ } };
    for (const llama_opt_span & h : holes_) {
        llama_opt_spans_subtract(live, h.first, h.second);
    }
    return live;
}

void llama_opt_session_history::computed_canonically(size_t end) {
    n_canonical_ = end < ctx_.min_chunk() ? 0 : end / ctx_.row_align() * ctx_.row_align();
}

size_t llama_opt_session_history::hash_new_blocks() {
    const uint32_t B     = ctx_.block_size();
    const size_t   first = chain_.size();
    for (size_t k = first; (k + 1) * B <= n_canonical_; ++k) {
        chain_.push_back(ctx_.memory().block_hash(k == 0 ? LLAMA_OPT_CHAIN_ROOT : chain_[k - 1], tokens_.data() + k * B));
    }
    return first;
}

void llama_opt_session_history::adopt_blocks(const std::vector<uint64_t> & hashes) {
    chain_.insert(chain_.end(), hashes.begin(), hashes.end());
    restored(chain_.size() * ctx_.block_size());
}

void llama_opt_session_history::drop_kv_from(size_t pos) {
    drop_draft();
    if (pos >= n_evaluated_) {
        return;
    }
    pos = ctx_.memory().truncate(seq_, pos);  // may cut lower: never inside a shared block
    const size_t keep_blocks = ctx_.canonical() ? pos / ctx_.block_size() : 0;  // complete blocks below pos
    chain_.resize(std::min(chain_.size(), keep_blocks));
    n_canonical_ = std::min(n_canonical_, pos / ctx_.row_align() * ctx_.row_align());
    n_evaluated_ = pos;
    llama_opt_spans_subtract(holes_, pos, SIZE_MAX);
    follow_cuts_(pos);
    if (pos <= approx_from_) {
        approx_from_ = npos;  // what is left is exact
    }
}

void llama_opt_session_history::lose_kv() {
    draft_.clear();  // its cells went with the rest of the sequence's KV
    chain_.clear();
    n_evaluated_ = n_canonical_ = 0;
    approx_from_ = npos;
    llama_opt_spans_subtract(holes_, 0, SIZE_MAX);
    follow_cuts_(0);
}

void llama_opt_session_history::drop_kv(size_t p0, size_t p1) {
    ctx_.memory().drop(seq_, p0, p1);
    llama_opt_spans_add(holes_, p0, p1);
    approx_from_ = std::min(approx_from_, p0);
    const size_t B = ctx_.block_size();
    n_canonical_   = std::min(n_canonical_, p0 / B * B);  // the exact prefix: what forks and the disk tier take
    chain_.resize(std::min(chain_.size(), n_canonical_ / B));
    logits_for_ = 0;  // the logits are computed again with the KV that is left
}

void llama_opt_session_history::refill(size_t p0, size_t p1) {
    llama_opt_spans_subtract(holes_, p0, p1);
}

void llama_opt_session_history::drop_joined_spans() {
    n_evaluated_ = ctx_.memory().truncate(seq_, n_evaluated_);
    tokens_.resize(n_evaluated_);  // the history whose KV exists
}

void llama_opt_session_history::fork_to(llama_opt_session_history & fork) const {
    fork.tokens_ = tokens_;
    // canonical: share the complete blocks (a tile is never shared half-filled), the rest is
    // the fork's own to compute; otherwise share everything computed so far
    const size_t B      = ctx_.block_size();
    const size_t shared = ctx_.canonical() ? n_canonical_ / B * B : n_evaluated_;
    if (shared > 0) {
        ctx_.memory().share(seq_, fork.seq_, 0, shared);
    }
    fork.n_evaluated_ = shared;
    fork.n_canonical_ = ctx_.canonical() ? shared : 0;
    fork.chain_.assign(chain_.begin(), chain_.begin() + std::min(chain_.size(), shared / B));
    if (!ctx_.canonical() && logits_current()) {
        fork.logits_     = logits_;
        fork.logits_for_ = logits_for_;
    }
}

void llama_opt_session_history::compute(size_t begin, size_t end, uint64_t llama_opt_stats::* counter,
                                        bool evict_sessions, bool logits, const llama_opt_row_logits & each_row) {
    llama_opt_work work;
    llama_opt_finally(
        [&] { ctx_.compute_span(seq_, tokens_.data(), begin, end, logits ? &logits_ : nullptr, evict_sessions, work, each_row); },
        [&] { counters_.count_work(counter, work); });
    if (logits) {
        logits_for_ = end;
    }
}

void llama_opt_session_history::compute_at(const std::vector<size_t> & positions, uint64_t llama_opt_stats::* counter,
                                           bool evict_sessions) {
    llama_opt_work work;
    llama_opt_finally(
        [&] { ctx_.compute_positions(seq_, tokens_.data(), positions, logits_, evict_sessions, work); },
        [&] { counters_.count_work(counter, work); });
    logits_for_ = positions.back() + 1;
}

void llama_opt_session_history::compute_h2o(size_t end) {
    llama_opt_work     work;
    llama_opt_h2o_work h2o;
    llama_opt_finally([&] { llama_opt_h2o_prefill(ctx_, seq_, tokens_.data(), end, &logits_, work, h2o); },
                           [&] {
                               counters_.count_work(&llama_opt_stats::tokens_prefilled, work);
                               counters_.count(&llama_opt_stats::h2o_chunks, h2o.chunks);
                               counters_.count(&llama_opt_stats::h2o_tokens_kept, h2o.tokens_kept);
                               counters_.count(&llama_opt_stats::h2o_select_us, h2o.select_us);
                           });
    logits_for_ = end;
}

void llama_opt_session_history::take_logits(const float * logits) {
    logits_.assign(logits, logits + ctx_.model().n_vocab());
    logits_for_ = n_evaluated_;
}

void llama_opt_session_history::clear_logits() {
    logits_.clear();
    logits_for_ = 0;
}

void llama_opt_session_history::start_draft(std::vector<llama_token> tokens, bool shared) {
    draft_.start(std::move(tokens), ctx_.model().n_vocab(), shared);
}

bool llama_opt_session_history::confirm_draft(llama_token token) {
    const float * after = draft_.confirm(token);
    if (!after) {
        drop_draft();
        return false;
    }
    n_evaluated_ = tokens_.size();
    take_logits(after);
    return true;
}

void llama_opt_session_history::drop_draft() {
    if (draft_.active()) {
        ctx_.memory().remove(seq_, (llama_pos) n_evaluated_, -1);
    }
    draft_.clear();
}

void llama_opt_session_history::release_draft() {
    draft_.release();
}

std::string llama_opt_session_history::invariant_violation() const {
    const size_t in_memory = ctx_.memory().end(seq_);
    std::string  what;
    if (in_memory != n_evaluated_ || n_canonical_ > n_evaluated_ || n_evaluated_ > tokens_.size()) {
        what = std::to_string(in_memory) + " positions in the KV memory";
    }
    // holes: the first position of every block (a lookup scans the cells: the last one of each
    // block too would double the cost for little)
    for (size_t pos = 0; what.empty() && pos < n_evaluated_; pos += ctx_.block_size()) {
        const bool has_kv = ctx_.memory().cell(seq_, pos) >= 0;
        if (has_kv == in_hole(pos)) {  // a dropped position (Tier 2) must have none
            what = (has_kv ? "KV at dropped position " : "no KV at position ") + std::to_string(pos);
        }
    }
    if (what.empty()) {
        return "";
    }
    return "inv1: a history of " + std::to_string(tokens_.size()) + " tokens, " + std::to_string(n_evaluated_) +
           " of them with KV by the session's account (" + std::to_string(n_canonical_) + " canonical), " + what;
}
