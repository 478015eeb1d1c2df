#include "llama-opt-session.h"

#include "llama-context-hash.h"
#include "llama-kv-cache-diff.h"
#include "llama-memo.h"
#include "llama-opt-context.h"
#include "llama-opt-log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

using lock_t = std::lock_guard<std::recursive_mutex>;

std::shared_ptr<llama_opt_session> llama_opt_session::open(std::shared_ptr<llama_opt_context> ctx) {
    lock_t lock(ctx->mutex());
    auto session  = std::make_shared<llama_opt_session>(ctx);
    session->seq_ = ctx->memory().acquire_seq(session);
    return session;
}

llama_opt_session::llama_opt_session(std::shared_ptr<llama_opt_context> ctx)
    : ctx_(std::move(ctx)), sampler_(ctx_->model(), ctx_->settings().config) {}

llama_opt_session::~llama_opt_session() {
    close();
}

bool llama_opt_session::closed() const {
    return closed_ || evicted_ || ctx_->closed();
}

void llama_opt_session::check_open() const {
    if (evicted_) {
        throw llama_opt_error(llama_opt_errc::session_evicted,
            "this session was idle when the KV cache ran out of room and its KV was evicted; open a new session "
            "(and sync it to the same tokens), or create the Context with a larger n_ctx");
    }
    if (closed()) {
        throw llama_opt_error(llama_opt_errc::session_closed,
            "this session is closed; open a new one with context.session()");
    }
}

void llama_opt_session::close() {
    lock_t lock(ctx_->mutex());
    if (seq_ >= 0 && !closed()) {  // seq_ < 0: open() found no sequence for it
        drop_draft();
        if (ctx_->memory().persist()) {
            save_quietly();
        }
        ctx_->memory().release_seq(seq_, this);
    }
    closed_ = true;
}

void llama_opt_session::discard() {
    lock_t lock(ctx_->mutex());
    if (seq_ >= 0 && !closed()) {
        drop_draft();
        ctx_->memory().release_seq(seq_, this, /* keep_blocks */ false);
    }
    closed_ = true;
}

void llama_opt_session::on_evicted() {
    memo_.clear();  // its cells went with the rest of the sequence's KV
    chain_.clear();
    n_evaluated_ = n_canonical_ = 0;
    approx_from_ = npos;
    evicted_     = true;
    forget_holes(0);
}

void llama_opt_session::on_kv_leaving() {
    if (!closed()) {
        save_quietly();
    }
}

void llama_opt_session::count(uint64_t llama_opt_stats::* counter, uint64_t n) {
    stats_.*counter += n;
    ctx_->count(counter, n);
}

void llama_opt_session::count_work(uint64_t llama_opt_stats::* counter, const llama_opt_work & work) {
    count(counter, work.tokens);
    count(&llama_opt_stats::forward_passes, work.passes);
    count(&llama_opt_stats::forward_us, work.us);
}

void llama_opt_session::compute(size_t begin, size_t end, uint64_t llama_opt_stats::* counter, bool evict_sessions,
                                bool logits) {
    llama_opt_work work;
    try {
        ctx_->compute_span(seq_, tokens_.data(), begin, end, logits ? &logits_ : nullptr, evict_sessions, work);
    } catch (...) {
        count_work(counter, work);  // the chunks computed before the failure: thrown away, but done
        throw;
    }
    count_work(counter, work);
    if (logits) {
        logits_for_ = end;
    }
}

void llama_opt_session::compute_at(const std::vector<size_t> & positions, uint64_t llama_opt_stats::* counter,
                                   bool evict_sessions) {
    llama_opt_work work;
    try {
        ctx_->compute_positions(seq_, tokens_.data(), positions, logits_, evict_sessions, work);
    } catch (...) {
        count_work(counter, work);  // the chunks computed before the failure: thrown away, but done
        throw;
    }
    count_work(counter, work);
    logits_for_ = positions.back() + 1;
}

size_t llama_opt_session::room() const {
    return ctx_->n_ctx() > tokens_.size() ? ctx_->n_ctx() - tokens_.size() : 0;
}

void llama_opt_session::check_fits(size_t n_tokens) const {
    if (n_tokens > ctx_->n_ctx()) {
        throw llama_opt_error(llama_opt_errc::context_overflow,
            "the session would hold " + std::to_string(n_tokens) + " tokens, more than the context size n_ctx=" +
            std::to_string(ctx_->n_ctx()) + "; start a new session or create the Context with a larger n_ctx", "n_ctx");
    }
}

void llama_opt_session::forget(size_t pos) {
    drop_draft();
    if (pos >= n_evaluated_) {
        return;
    }
    pos = ctx_->memory().truncate(seq_, pos);  // may cut lower: never inside a shared block
    const size_t keep_blocks = ctx_->canonical() ? pos / ctx_->block_size() : 0;  // complete blocks below pos
    chain_.resize(std::min(chain_.size(), keep_blocks));
    n_canonical_ = std::min(n_canonical_, pos / ctx_->row_align() * ctx_->row_align());
    n_evaluated_ = pos;
    forget_holes(pos);
    if (pos <= approx_from_) {
        approx_from_ = npos;  // what is left is exact
    }
}

// Where computing up to `end` may start at the latest: the last chunk must hold at least
// min_chunk() tokens (it computes the logits of the last token) and start at a multiple of
// row_align().
static size_t reusable_prefix(size_t end, const llama_opt_context & ctx) {
    return end >= ctx.min_chunk() ? (end - ctx.min_chunk()) / ctx.row_align() * ctx.row_align() : 0;
}

void llama_opt_session::adopt_shared_prefix() {
    llama_opt_block_pool * pool = ctx_->memory().pool();
    const uint32_t B = ctx_->block_size();
    const size_t shareable = reusable_prefix(tokens_.size(), *ctx_) / B;
    const size_t own       = n_canonical_ / B;  // complete blocks of our own
    if (shareable * B <= n_canonical_) {
        return;
    }
    count(&llama_opt_stats::dedup_blocks_total, shareable - own);

    // walk the pool along this history; a holder of block k holds every block before it
    std::vector<const llama_opt_kv_block *> path;
    uint64_t chain = LLAMA_OPT_CHAIN_ROOT, parent = 0;
    for (size_t k = 0; k < shareable; ++k) {
        const llama_token * t = tokens_.data() + k * B;
        chain = ctx_->memory().block_hash(chain, t);
        const llama_opt_kv_block * b = pool->lookup(chain, parent, t, B);
        if (!b || std::none_of(b->holders.begin(), b->holders.end(), [&](int32_t h) { return h != seq_; })) {
            break;
        }
        path.push_back(b);
        parent = b->id;
    }
    if (path.size() * B <= n_canonical_) {
        return;
    }
    // take the whole prefix from one holder, so that our cells stay in position order
    int32_t holder = -1;
    for (int32_t h : path.back()->holders) {
        if (h != seq_) {
            holder = h;
            break;
        }
    }
    const size_t n_shared = path.size() * B;
    const size_t saved    = n_shared - std::min(n_shared, n_canonical_);
    forget(0);
    ctx_->memory().share(holder, seq_, 0, n_shared);
    for (const llama_opt_kv_block * b : path) {
        ctx_->memory().hold_block(seq_, b);
        chain_.push_back(b->hash);
    }
    count(&llama_opt_stats::dedup_blocks_hit, path.size() - std::min(path.size(), own));
    count(&llama_opt_stats::dedup_tokens_saved, saved);
    n_canonical_ = n_evaluated_ = n_shared;
}

void llama_opt_session::register_blocks() {
    const uint32_t B = ctx_->block_size();
    llama_opt_block_pool * pool = ctx_->memory().pool();
    for (size_t k = chain_.size(); (k + 1) * B <= n_canonical_; ++k) {
        const llama_token * t = tokens_.data() + k * B;
        chain_.push_back(ctx_->memory().block_hash(k == 0 ? LLAMA_OPT_CHAIN_ROOT : chain_[k - 1], t));
        const std::vector<uint64_t> & held = ctx_->memory().held_blocks(seq_);
        if (pool && held.size() == k) {  // a block can be pooled only after its parent
            const llama_opt_kv_block * b = ctx_->memory().pool_insert(seq_, chain_[k], k == 0 ? 0 : held[k - 1], (uint32_t) k, t);
            if (b) {
                const bool duplicate = !b->holders.empty();  // another sequence computed it too
                ctx_->memory().hold_block(seq_, b);
                if (duplicate && ctx_->settings().config.canon_enabled) {
                    share_duplicate(k, b);
                }
            }
        }
    }
}

// A block we computed although another sequence holds it (the last chunk must hold
// min_chunk() tokens, so a session whose own suffix is short computes the end of a shared
// prefix again). Its values are bitwise those of the other copy (canonical schedule), so we
// drop ours and share theirs, if their cells keep ours in position order (patches/0004).
void llama_opt_session::share_duplicate(size_t k, const llama_opt_kv_block * b) {
    const size_t  B     = ctx_->block_size();
    const size_t  start = k * B;
    const int32_t below = k == 0 ? -1 : ctx_->memory().cell(seq_, start - 1);
    const int32_t above = ctx_->memory().cell(seq_, start + B);
    count(&llama_opt_stats::canon_entries_total, 1);
    for (int32_t holder : b->holders) {
        if (holder == seq_) {
            continue;
        }
        const int32_t first = ctx_->memory().cell(holder, start);
        const int32_t last  = ctx_->memory().cell(holder, start + B - 1);
        if (first > below && last >= first && (above < 0 || last < above)) {
            ctx_->memory().remove(seq_, (llama_pos) start, (llama_pos) (start + B));
            ctx_->memory().share(holder, seq_, start, start + B);
            count(&llama_opt_stats::canon_entries_deduped, 1);
            count(&llama_opt_stats::canon_bytes_saved, (uint64_t) B * ctx_->model().kv_bytes_per_token());
            return;
        }
    }
}

void llama_opt_session::prefill(uint64_t llama_opt_stats::* counter) {
    const size_t end = tokens_.size();
    const bool   h2o = uses_h2o(end);
    if (h2o) {
        approx_from_ = 0;  // Tier 2: the whole prompt is computed by H2O's chunks (docs/h2o.md)
    }
    // an approximate session (Tier 2) keeps its KV as it is and is never pooled beyond n_canonical_
    bool canonical = ctx_->canonical() && !approximate();
    if (canonical && ctx_->settings().config.diff_reuse_generated && n_canonical_ < n_evaluated_ && n_evaluated_ < end) {
        // Tier 2: the rows computed off the canonical schedule (generated tokens, decoded one at
        // a time; the last rows of a chunk) stay, as llama.cpp's own prefix reuse keeps them
        approx_from_ = n_canonical_;
        canonical    = false;
    }
    if (canonical) {
        // what is not canonical (generated tokens, the last rows of a chunk) is computed again
        forget(std::min(n_canonical_, reusable_prefix(end, *ctx_)));
        if (ctx_->memory().dedup()) {
            adopt_shared_prefix();
        }
        restore_from_disk(end);
    }
    if (n_evaluated_ < end) {
        // canonical: the room is found before anything is computed (a chunk that failed for want of
        // it would throw the chunks before it away)
        if (ctx_->canonical() && !room_or_bottom(end)) {
            throw ctx_->memory().full_error();
        }
        if (h2o) {
            compute_h2o(end);
        } else if (!spec_prefill(end, counter)) {
            compute(n_evaluated_, end, counter, /* evict_sessions */ !ctx_->canonical());
        }
        n_evaluated_ = end;
    }
    if (ctx_->canonical() && !approximate()) {  // a relocation (above) computed an approximate session exactly
        // computed again when the history grows: the rows of the last, incomplete group of
        // row_align(), and a whole history shorter than min_chunk() (it was one small chunk)
        n_canonical_ = end < ctx_->min_chunk() ? 0 : end / ctx_->row_align() * ctx_->row_align();
        register_blocks();
    }
}

// Aligned placement grows a sequence only into tiles above its highest one. A history placed in the
// cache's top tiles (the free ones when it came) could not grow mid-answer although the cache had room
// below: the answer ended as "context full". Before the first token the room is found as prefill finds
// its own: KV above evicted (cached blocks), else the history computed again from the bottom (the same
// chunks: the same bits), letting idle sessions go if needed. Only a history with no empty tile above
// it at all (a history that has one grows as before: nothing is freed for room an answer may not use);
// up to OUTPUT_ROOM_RESERVED tokens of the budget: a longer answer that meets the top later moves down
// then (move_answer_down), which costs its tokens computed again too.
static constexpr size_t OUTPUT_ROOM_RESERVED = 512;

void llama_opt_session::reserve_output_room() {
    const size_t n = tokens_.size();
    if (!ctx_->canonical() || approximate() || n_evaluated_ != n || n == 0) {
        return;
    }
    const size_t end = std::min<size_t>(n + std::min<size_t>(output_budget_, OUTPUT_ROOM_RESERVED), ctx_->n_ctx());
    if (end <= n || ctx_->memory().tile_above(seq_) || (room_or_bottom(end) && n_evaluated_ == n)) {
        return;
    }
    ctx_->memory().make_room(seq_, 0, n, /* evict_sessions */ true);  // without room for the answer: the history's (it had it)
    compute(0, n, &llama_opt_stats::tokens_prefilled, /* evict_sessions */ true);
    n_evaluated_ = n;
    logits_for_  = n;
    n_canonical_ = n < ctx_->min_chunk() ? 0 : n / ctx_->row_align() * ctx_->row_align();
    register_blocks();
}

// Room for the history to grow to `end` tokens: KV above its cells evicted (cached sequences); if its
// cells (or a prefix taken from another sequence) sit too high for that although there may be room
// below, the history is dropped (forget(0): computed again from the bottom by the caller, without
// shared cells) and room for all of it made, letting idle sessions go if needed. False: none even then.
bool llama_opt_session::room_or_bottom(size_t end) {
    if (ctx_->memory().make_room(seq_, n_evaluated_, end, /* evict_sessions */ false)) {
        return true;
    }
    forget(0);
    return ctx_->memory().make_room(seq_, 0, end, /* evict_sessions */ true);
}

// An answer that meets the top of the cache (longer than the room reserved before its first token, or
// from a history that had a free tile above it then) while there is room below: the history and the
// answer so far are computed again from the bottom at once, the prompt on its canonical chunks and the
// answer's tokens in batches of at most LLAMA_OPT_ROW_INVARIANT_BATCH rows, each of which computes like
// the decode step that computed it first (patches/0006): the same KV bit for bit, so the answer goes on
// as if it had not moved. Before this, it ended as "context full" with most of the cache free. The
// room is checked before anything is dropped, for up to OUTPUT_ROOM_RESERVED more tokens of its budget
// (less room: the answer ends there, its KV kept), so that an answer moves at most once per that many
// tokens, not at every tile. (schema_skip_batch and schema_jump_forward, not exact anyway, computed forced tokens
// in larger batches: recomputed in these, the answer's later tokens may differ from an unmoved one's.)
void llama_opt_session::move_answer_down() {
    const size_t n = tokens_.size();
    if (!ctx_->canonical() || approximate() || !generating_ || n_evaluated_ < output_begin_ ||
        ctx_->memory().make_room(seq_, n_evaluated_, n, /* evict_sessions */ true)) {
        return;
    }
    const size_t generated = n - output_begin_;
    const size_t left      = output_budget_ > generated ? output_budget_ - generated : 0;
    const size_t end       = std::min<size_t>(n + std::min(left, OUTPUT_ROOM_RESERVED), ctx_->n_ctx());
    if (!ctx_->memory().room_after_drop(seq_, end)) {
        return;
    }
    const size_t evaluated = n_evaluated_;
    forget(0);
    if (!ctx_->memory().make_room(seq_, 0, end, /* evict_sessions */ true)) {
        throw ctx_->memory().full_error();  // (checked above: not expected)
    }
    // without logits: the last ones, which sampled the pending token, stay
    compute(0, output_begin_, &llama_opt_stats::tokens_prefilled, /* evict_sessions */ true, /* logits */ false);
    n_evaluated_ = output_begin_;
    n_canonical_ = n_evaluated_ < ctx_->min_chunk() ? 0 : n_evaluated_ / ctx_->row_align() * ctx_->row_align();
    register_blocks();
    while (n_evaluated_ < evaluated) {
        const size_t stop = std::min<size_t>(evaluated, n_evaluated_ + LLAMA_OPT_ROW_INVARIANT_BATCH);
        compute(n_evaluated_, stop, &llama_opt_stats::tokens_decoded, /* evict_sessions */ true, /* logits */ false);
        n_evaluated_ = stop;
    }
}

void llama_opt_session::decode_pending_step() {
    // generated tokens without KV yet: the last sampled one, and any the grammar forced after it
    if (n_evaluated_ == 0 || n_evaluated_ >= tokens_.size() || logits_for_ != n_evaluated_) {
        return;
    }
    move_answer_down();
    if (generating_ && n_evaluated_ + 1 == tokens_.size() && check_draft()) {
        return;
    }
    const llama_opt_config & cfg = ctx_->settings().config;
    if (!cfg.schema_skip_batch && !cfg.schema_jump_forward) {
        // as if nothing had been skipped (bitwise the same KV): batches small enough that each
        // row computes like a one-token step (patches/0006), without logits but for the last
        while (tokens_.size() - n_evaluated_ > LLAMA_OPT_ROW_INVARIANT_BATCH) {
            compute(n_evaluated_, n_evaluated_ + LLAMA_OPT_ROW_INVARIANT_BATCH, &llama_opt_stats::tokens_decoded,
                    true, /* logits */ false);
            n_evaluated_ += LLAMA_OPT_ROW_INVARIANT_BATCH;
        }
    }
    compute(n_evaluated_, tokens_.size(), &llama_opt_stats::tokens_decoded, true);
    n_evaluated_ = tokens_.size();
}

bool llama_opt_session::step_rows(std::vector<llama_opt_row> & rows, llama_opt_memo_draft & draft) const {
    if (closed() || !generating_ || n_evaluated_ == 0 || n_evaluated_ + 1 != tokens_.size() ||
        logits_for_ != n_evaluated_ || sampler_.has_inferred() || room() == 0) {
        return false;  // (a grammar that may force the next token: the row's logits may go unused, its KV not)
    }
    draft = find_draft();  // what check_draft() would check in the session's own step
    rows.push_back({ seq_, n_evaluated_, tokens_.back() });
    for (size_t i = 0; i < draft.tokens.size(); ++i) {
        rows.push_back({ seq_, n_evaluated_ + 1 + i, draft.tokens[i] });
    }
    return true;
}

void llama_opt_session::take_rows(const float * logits, llama_opt_memo_draft draft, uint64_t us) {
    const size_t n_vocab = ctx_->model().n_vocab();
    const size_t n_rows  = 1 + draft.tokens.size();
    stats_.tokens_decoded += n_rows;  // the context counts the batch's tokens, its one pass and its time
    stats_.forward_passes += 1;
    stats_.forward_us += us;
    if (ctx_->settings().config.memo_enabled) {  // as check_draft() counts its step
        count(&llama_opt_stats::memo_lookups, 1);
    }
    if (!draft.tokens.empty()) {
        count(&llama_opt_stats::memo_hits, 1);
        if (draft.shared) {
            count(&llama_opt_stats::memo_shared_hits, 1);
        }
        memo_.rows().assign(logits, logits + n_rows * n_vocab);
        memo_.start(std::move(draft.tokens), n_vocab, draft.shared);
    }
    n_evaluated_ = tokens_.size();
    logits_.assign(logits, logits + n_vocab);
    logits_for_ = n_evaluated_;
}

void llama_opt_session::prefetch_steps(const std::vector<std::shared_ptr<llama_opt_session>> & sessions) {
    if (sessions.empty()) {
        return;
    }
    llama_opt_context & ctx = *sessions.front()->ctx_;
    lock_t lock(ctx.mutex());
    std::vector<llama_opt_session *>  takers;
    std::vector<llama_opt_memo_draft> drafts;     // each taker's draft (its rows after the first)
    std::vector<size_t>               first_row;  // each taker's first row
    std::vector<llama_opt_row>        rows;
    std::vector<float>                logits;
    const size_t n_vocab = ctx.model().n_vocab();
    auto flush = [&] {
        llama_opt_work work;
        if (takers.size() > 1 && ctx.compute_rows(rows, logits, work)) {  // one step alone: its own is the same
            ctx.count(&llama_opt_stats::tokens_decoded, work.tokens);
            ctx.count(&llama_opt_stats::forward_passes, work.passes);
            ctx.count(&llama_opt_stats::forward_us, work.us);
            for (size_t i = 0; i < takers.size(); ++i) {
                const size_t n_rows = 1 + drafts[i].tokens.size();
                takers[i]->take_rows(logits.data() + first_row[i] * n_vocab, std::move(drafts[i]),
                                     work.us * n_rows / rows.size());
            }
        }
        takers.clear();
        drafts.clear();
        first_row.clear();
        rows.clear();
    };
    for (const auto & s : sessions) {
        if (s->ctx_.get() != &ctx) {
            throw llama_opt_error(llama_opt_errc::invalid_argument, "prefetch_steps: the sessions belong to different contexts");
        }
        std::vector<llama_opt_row> own;
        llama_opt_memo_draft       draft;
        if (!s->step_rows(own, draft)) {
            continue;
        }
        if (rows.size() + own.size() > LLAMA_OPT_ROW_INVARIANT_BATCH) {
            flush();  // (a draft is at most LLAMA_OPT_MEMO_MATCH_MAX tokens: one step always fits)
        }
        takers.push_back(s.get());
        drafts.push_back(std::move(draft));
        first_row.push_back(rows.size());
        rows.insert(rows.end(), own.begin(), own.end());
    }
    flush();
}

llama_opt_memo_draft llama_opt_session::find_draft() const {
    const llama_opt_config & cfg = ctx_->settings().config;
    if (!cfg.memo_enabled) {
        return {};
    }
    auto max_tokens = (uint32_t) std::min<size_t>(cfg.memo_draft_max, room());
    if (output_budget_ > 0) {
        // row j of the check gives the logits of the output's token (generated + 1 + j): none past the budget
        const size_t generated = tokens_.size() - std::min(output_begin_, tokens_.size());
        max_tokens = (uint32_t) std::min<size_t>(max_tokens, output_budget_ > generated + 1 ? output_budget_ - generated - 1 : 0);
    }
    if (max_tokens == 0) {
        return {};
    }
    llama_opt_memo_draft draft = llama_opt_memo_find(tokens_.data(), tokens_.size(), max_tokens);
    if (cfg.memo_shared) {
        ctx_->memo_outputs().improve(tokens_.data(), tokens_.size(), max_tokens, draft);
    }
    return draft;
}

// memo (llama-memo.h): when the history repeats itself, the pending token and a draft of what
// followed earlier go through one batch, whose rows compute bit for bit like one-token decode
// steps (patches/0006): row i holds the logits after i drafted tokens. Sampling then confirms
// drafted tokens one by one (take_checked) as long as it picks them, exactly as plain decoding
// would have gone on.
bool llama_opt_session::check_draft() {
    if (!ctx_->settings().config.memo_enabled) {
        return false;
    }
    count(&llama_opt_stats::memo_lookups, 1);
    const llama_opt_memo_draft draft = find_draft();
    if (draft.tokens.empty()) {
        return false;
    }
    std::vector<llama_opt_row> rows = { { seq_, n_evaluated_, tokens_.back() } };
    for (size_t i = 0; i < draft.tokens.size(); ++i) {
        rows.push_back({ seq_, n_evaluated_ + 1 + i, draft.tokens[i] });
    }
    llama_opt_work work;
    if (!ctx_->compute_rows(rows, memo_.rows(), work)) {
        return false;  // no room for the draft: a plain step
    }
    count_work(&llama_opt_stats::tokens_decoded, work);
    count(&llama_opt_stats::memo_hits, 1);
    if (draft.shared) {
        count(&llama_opt_stats::memo_shared_hits, 1);
    }
    const size_t n_vocab = ctx_->model().n_vocab();
    memo_.start(draft.tokens, n_vocab, draft.shared);
    n_evaluated_ = tokens_.size();
    logits_.assign(memo_.row(0), memo_.row(0) + n_vocab);
    logits_for_ = n_evaluated_;
    return true;
}

void llama_opt_session::take_checked(llama_token token) {
    if (!memo_.active()) {
        return;
    }
    const float * after = memo_.confirm(token);  // its KV and the logits after it came with the check
    if (!after) {
        drop_draft();
        return;
    }
    n_evaluated_ = tokens_.size();
    logits_.assign(after, after + ctx_->model().n_vocab());
    logits_for_ = n_evaluated_;
    count(&llama_opt_stats::memo_tokens_skipped, 1);
    if (memo_.shared()) {
        count(&llama_opt_stats::memo_shared_tokens_skipped, 1);
    }
}

void llama_opt_session::publish_output() {
    const llama_opt_config & cfg = ctx_->settings().config;
    const size_t begin = std::min(output_begin_, tokens_.size());
    if (generating_ && cfg.memo_enabled && cfg.memo_shared && !closed()) {
        ctx_->memo_outputs().add(tokens_.data(), begin, tokens_.data() + begin, tokens_.size() - begin);
    }
}

void llama_opt_session::drop_draft() {
    if (memo_.active()) {
        ctx_->memory().remove(seq_, (llama_pos) n_evaluated_, -1);
    }
    memo_.clear();
}

void llama_opt_session::ensure_logits(uint64_t llama_opt_stats::* counter) {
    if (tokens_.empty()) {
        logits_.clear();
        logits_for_ = 0;
        return;
    }
    if (n_evaluated_ < tokens_.size()) {
        if (ctx_->canonical()) {
            prefill(counter);
        } else {
            compute(n_evaluated_, tokens_.size(), counter, true);
            n_evaluated_ = tokens_.size();
        }
    }
    if (logits_for_ != n_evaluated_ && n_evaluated_ > 0) {
        // the history was cut back: compute its end again (canonical: a whole last chunk)
        forget(ctx_->canonical() && !approximate() ? reusable_prefix(n_evaluated_, *ctx_) : n_evaluated_ - 1);
        ensure_logits(counter);
    }
}

std::vector<float> llama_opt_session::logits() {
    lock_t lock(ctx_->mutex());
    check_open();
    decode_pending_step();  // peeking must not change how generation goes on
    ensure_logits(&llama_opt_stats::tokens_prefilled);
    return logits_;
}

std::string llama_opt_session::invariant_violation() const {
    lock_t lock(ctx_->mutex());
    if (closed()) {
        return "";
    }
    const size_t in_memory = ctx_->memory().end(seq_);
    std::string  what;
    if (in_memory != n_evaluated_ || n_canonical_ > n_evaluated_ || n_evaluated_ > tokens_.size()) {
        what = std::to_string(in_memory) + " positions in the KV memory";
    }
    // holes: the first position of every block (a lookup scans the cells: the last one of each
    // block too would double the cost for little)
    for (size_t pos = 0; what.empty() && pos < n_evaluated_; pos += ctx_->block_size()) {
        const bool has_kv = ctx_->memory().cell(seq_, pos) >= 0;
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

std::vector<llama_token> llama_opt_session::tokens() const {
    lock_t lock(ctx_->mutex());
    return tokens_;
}

void llama_opt_session::append(const std::vector<llama_token> & tokens) {
    lock_t lock(ctx_->mutex());
    check_open();
    ctx_->model().check_tokens(tokens.data(), tokens.size());
    check_fits(tokens_.size() + tokens.size());
    drop_draft();
    const size_t old_size = tokens_.size();
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    prefill_or_cut_back(old_size);  // on failure: the old history
}

void llama_opt_session::prefill_or_cut_back(size_t keep) {
    try {
        prefill(&llama_opt_stats::tokens_prefilled);
    } catch (...) {
        if (keep == npos) {
            keep = n_evaluated_;
        }
        forget(std::min(n_evaluated_, keep));  // KV beyond it (e.g. a prefix taken from another sequence) goes
        tokens_.resize(keep);
        throw;
    }
}

void llama_opt_session::sync(const std::vector<llama_token> & tokens) {
    lock_t lock(ctx_->mutex());
    check_open();
    ctx_->model().check_tokens(tokens.data(), tokens.size());
    check_fits(tokens.size());

    const llama_opt_config & cfg = ctx_->settings().config;
    size_t keep = 0;  // exact reuse: the common prefix only (KV after a change depends on it)
    if (cfg.diff_enabled) {
        while (keep < n_evaluated_ && keep < tokens.size() && tokens_[keep] == tokens[keep]) {
            ++keep;
        }
    }
    const uint64_t computed_before = stats_.tokens_prefilled;
    const bool     edited          = keep < n_evaluated_ && keep < tokens.size();
    const std::vector<span_move> moves =
        cfg.diff_enabled && cfg.diff_reuse_shifted && edited ? plan_shifted(tokens, keep) : std::vector<span_move>();
    if (moves.empty() || !sync_shifted(tokens, keep, moves)) {
        forget(keep);
        tokens_ = tokens;
        prefill_or_cut_back(npos);  // on failure: the tokens whose KV exists
    }
    if (!cfg.diff_enabled) {
        return;
    }
    const uint64_t recomputed = stats_.tokens_prefilled - computed_before;
    count(&llama_opt_stats::diff_tokens_total, tokens.size());
    count(&llama_opt_stats::diff_tokens_recomputed, recomputed);
    count(&llama_opt_stats::diff_tokens_unchanged, tokens.size() - std::min<uint64_t>(recomputed, tokens.size()));
}

// Tier 2 (approximate, opt-in): after an edit, the KV of the unchanged spans that follow it is
// reused at their new positions (rows moved within the session's own aligned cells, K rotated by
// the shift: patches/0005) instead of being computed again, as CacheBlend does. Those rows were computed
// without the edit, so they are approximate; the first diff_recompute_share of each span, where
// the edit matters most, is computed again, and so is the last token (its logits are needed).
// An edit in the first block (a per-request header) changes the attention sinks every later token
// attends to: diff_recompute_share_head then (measured: docs/benchmarks.md, "The head share").
// Approximate KV never enters the block pool.
std::vector<llama_opt_session::span_move> llama_opt_session::plan_shifted(const std::vector<llama_token> & tokens,
                                                                          size_t keep) const {
    const llama_opt_config & cfg = ctx_->settings().config;
    // the rest of the block the edit is in is computed again, whatever the share: the tokens
    // closest to the edit
    const size_t B          = ctx_->block_size();
    const size_t first_free = (keep + B - 1) / B * B;
    const llama_opt_diff_engine engine(ctx_->block_size(), cfg.diff_min_unchanged);
    const llama_opt_diff_result diff =
        engine.compute(tokens_.data(), (uint32_t) n_evaluated_, tokens.data(), (uint32_t) tokens.size());

    const float share = keep < B ? cfg.diff_recompute_share_head : cfg.diff_recompute_share;
    std::vector<span_move> moves;
    for (const llama_opt_diff_span & d : diff) {
        if (d.op != DIFF_KEEP || d.curr_start == 0) {
            continue;  // the common prefix stays where it is, exactly
        }
        size_t again = (size_t) std::ceil(share * (double) d.curr_length);
        again        = std::max(again, first_free > d.prev_start ? first_free - d.prev_start : 0);
        const size_t to    = d.curr_start + again;
        const size_t n     = std::min<size_t>(d.curr_length - std::min<size_t>(again, d.curr_length),
                                              tokens.size() - 1 > to ? tokens.size() - 1 - to : 0);
        if (n >= cfg.diff_min_unchanged) {
            moves.push_back({ d.prev_start + again, to, n });
        }
    }
    return moves;
}

// The order to park spans in: their rows move within the session's own cells (like memmove), so
// a span whose new place overlaps where another span still is waits for it. Spans keep their
// order, so the waits form no cycle (a span reaching right into the next one's place while that
// one reaches left into its own would need their new places to cross).
std::vector<llama_opt_session::span_move> llama_opt_session::parking_order(std::vector<span_move> moves) {
    std::vector<span_move> order;
    while (!moves.empty()) {
        const auto next = std::find_if(moves.begin(), moves.end(), [&](const span_move & m) {
            return std::none_of(moves.begin(), moves.end(), [&](const span_move & other) {
                return &other != &m && m.to < other.from + other.n && other.from < m.to + m.n;
            });
        });
        order.push_back(*next);
        moves.erase(next);
    }
    return order;
}

bool llama_opt_session::sync_shifted(const std::vector<llama_token> & tokens, size_t keep,
                                     const std::vector<span_move> & moves) {
    drop_draft();  // its cells would take room the moves may need
    const llama_opt_in_place in_place = ctx_->memory().prepare_in_place(seq_, keep, n_evaluated_, tokens.size());
    if (in_place != llama_opt_in_place::possible) {
        count(in_place == llama_opt_in_place::unsupported ? &llama_opt_stats::diff_shift_fallbacks_unsupported
              : in_place == llama_opt_in_place::shared    ? &llama_opt_stats::diff_shift_fallbacks_shared
                                                          : &llama_opt_stats::diff_shift_fallbacks_room, 1);
        return false;
    }
    for (const span_move & m : parking_order(moves)) {
        if (!ctx_->memory().park(seq_, m.from, m.to, m.n)) {  // not expected once prepared: counted as no room
            ctx_->memory().clear_parked();
            count(&llama_opt_stats::diff_shift_fallbacks_room, 1);
            return false;
        }
    }
    forget(keep);  // the rest of the old KV (the parked rows are the scratch sequence's)
    tokens_      = tokens;
    approx_from_ = n_evaluated_;
    // Every span joins the sequence first; then the tokens around them are computed in one series of
    // batches, at positions between the spans (patches/0012): a batch per gap was 1.3-2x the time per
    // token (docs/benchmarks.md, issue 23).
    std::vector<size_t> positions;
    size_t              pos     = n_evaluated_;
    size_t              shifted = 0;
    for (const span_move & m : moves) {  // in position order
        ctx_->memory().unpark(seq_, m.to, m.to + m.n);
        for (; pos < m.to; ++pos) {
            positions.push_back(pos);
        }
        pos = m.to + m.n;
        shifted += m.n;
    }
    for (; pos < tokens_.size(); ++pos) {
        positions.push_back(pos);  // the last token at least (plan_shifted leaves it out of every span)
    }
    try {
        compute_at(positions, &llama_opt_stats::tokens_prefilled, true);
        n_evaluated_ = tokens_.size();
        count(&llama_opt_stats::diff_tokens_shifted, shifted);
    } catch (const llama_opt_error & e) {
        ctx_->memory().clear_parked();
        n_evaluated_ = ctx_->memory().truncate(seq_, n_evaluated_);  // the spans joined above it
        tokens_.resize(n_evaluated_);  // the history whose KV exists
        if (e.code != llama_opt_errc::context_overflow) {
            throw;
        }
        // not expected (the memory's prepare_in_place found the room): exact mode's work, which can relocate
        count(&llama_opt_stats::diff_shift_fallbacks_room, 1);
        forget(std::min(n_evaluated_, keep));
        tokens_ = tokens;
        prefill_or_cut_back(npos);
        return true;
    }
    ctx_->memory().clear_parked();
    return true;
}

std::vector<uint64_t> llama_opt_session::persist_chain(size_t n_blocks) const {
    const uint32_t B = ctx_->block_size();
    std::vector<uint64_t> chain;
    for (size_t k = 0; k < n_blocks; ++k) {
        chain.push_back(llama_opt_hash_chain(k == 0 ? LLAMA_OPT_CHAIN_ROOT : chain.back(), tokens_.data() + k * B, B));
    }
    return chain;
}

size_t llama_opt_session::save() {
    lock_t lock(ctx_->mutex());
    check_open();
    if (!ctx_->memory().persist()) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "the persistent KV cache is off: create the Context with OptConfig(persist_enabled=True) "
            "(or LLAMA_OPT_PERSIST_ENABLED=1)", "persist_enabled");
    }
    return save_blocks();
}

void llama_opt_session::save_quietly() {
    try {
        save_blocks();
    } catch (const std::exception &) {
        count(&llama_opt_stats::persist_errors, 1);
    }
}

size_t llama_opt_session::save_blocks() {
    llama_opt_persist_store *        store  = ctx_->memory().persist();
    const llama_opt_persist_layout & layout = ctx_->memory().persist_layout();
    const uint32_t B        = ctx_->block_size();
    const size_t   n_blocks = n_canonical_ / B;  // exact KV only (approximate KV starts later)
    if (n_blocks == 0) {
        return 0;
    }
    const size_t n = n_blocks * B;
    const std::vector<uint64_t> chain = persist_chain(n_blocks);
    const llama_opt_persist_store::match stored = store->find(layout, chain, tokens_.data(), n_blocks);
    if (stored.n_blocks == n_blocks) {
        store->touch(stored.entry.path);  // used again: the last to go when the store is cleaned
        return n;  // stored already (maybe within a longer context)
    }
    std::vector<uint8_t> rows(n * layout.bytes_per_token);
    std::string why;
    if (!ctx_->memory().read(seq_, 0, n, rows.data())) {
        why = "the KV of the history is not all in the cache";
    } else if (store->save(layout, std::vector<llama_token>(tokens_.begin(), tokens_.begin() + n), chain, rows.data(), why,
                           (uint64_t) ctx_->settings().config.persist_max_mb << 20)) {
        count(&llama_opt_stats::persist_saves, 1);
        return n;
    }
    count(&llama_opt_stats::persist_errors, 1);
    llama_opt_log_warn("pyllamaopt: could not save the KV of a session: " + why);
    return 0;
}

// The disk tier after the RAM tier: blocks of a stored context that holds a longer prefix of
// this history than the session has are read back into its cells, bit for bit (the canonical
// schedule makes them equal to computing them here).
void llama_opt_session::restore_from_disk(size_t end) {
    llama_opt_persist_store * store = ctx_->memory().persist();
    if (!store) {
        return;
    }
    const llama_opt_persist_layout & layout = ctx_->memory().persist_layout();
    const uint32_t B    = ctx_->block_size();
    const size_t   want = reusable_prefix(end, *ctx_) / B;  // the last chunk is computed here
    const size_t   own  = n_canonical_ / B;
    if (want <= own) {
        return;
    }
    const llama_opt_persist_store::match m = store->find(layout, persist_chain(want), tokens_.data(), want);
    if (m.n_blocks <= own) {
        if (m.miss == llama_opt_persist_miss::incompatible) {
            count(&llama_opt_stats::persist_misses_incompatible, 1);
        } else if (m.n_blocks == 0) {
            count(&llama_opt_stats::persist_misses, 1);
        }
        return;
    }
    forget(own * B);
    const size_t piece = 16;  // blocks read and written at a time: bounded memory
    std::vector<uint8_t> rows(piece * B * layout.bytes_per_token);
    size_t k = own;
    while (k < m.n_blocks) {
        const uint32_t last = (uint32_t) std::min(k + piece, (size_t) m.n_blocks);
        std::string why;
        llama_opt_persist_miss miss;
        const uint32_t got = store->load(m.entry, (uint32_t) k, last, rows.data(), why, miss);
        if (!ctx_->memory().write(seq_, k * B, (k + got) * B, rows.data())) {
            break;  // no room: the rest is computed (and may relocate)
        }
        k += got;
        if (k < last) {
            if (miss == llama_opt_persist_miss::corrupt) {
                count(&llama_opt_stats::persist_misses_corrupt, 1);
                llama_opt_log_warn("pyllamaopt: removed a corrupt KV cache entry: " + why);
            }
            break;
        }
    }
    if (k > own) {
        n_evaluated_ = n_canonical_ = k * B;
        register_blocks();
        count(&llama_opt_stats::persist_loads, 1);
        count(&llama_opt_stats::persist_tokens_restored, (k - own) * B);
    }
}

std::shared_ptr<llama_opt_session> llama_opt_session::fork() {
    lock_t lock(ctx_->mutex());
    check_open();
    auto other = open(ctx_);
    other->tokens_ = tokens_;
    // canonical: share the complete blocks (a tile is never shared half-filled), the rest is
    // the fork's own to compute; otherwise share everything computed so far
    const size_t shared = ctx_->canonical() ? n_canonical_ / ctx_->block_size() * ctx_->block_size() : n_evaluated_;
    if (shared > 0) {
        ctx_->memory().share(seq_, other->seq_, 0, shared);
    }
    other->n_evaluated_ = shared;
    other->n_canonical_ = ctx_->canonical() ? shared : 0;
    other->chain_.assign(chain_.begin(), chain_.begin() + std::min(chain_.size(), shared / ctx_->block_size()));
    if (llama_opt_block_pool * pool = ctx_->memory().pool()) {
        for (uint64_t id : ctx_->memory().held_blocks(seq_)) {
            ctx_->memory().hold_block(other->seq_, pool->find(id));
        }
    }
    copy_tier2_to(*other);
    if (!ctx_->canonical() && logits_for_ == n_evaluated_) {
        other->logits_     = logits_;
        other->logits_for_ = logits_for_;
    }
    return other;
}

void llama_opt_session::set_sampling(const llama_opt_sampling & sampling) {
    lock_t lock(ctx_->mutex());
    sampler_.set_sampling(sampling);
}

void llama_opt_session::set_grammar(const std::string & gbnf, uint32_t max_tokens) {
    lock_t lock(ctx_->mutex());
    sampler_.set_grammar(gbnf, max_tokens);
    output_budget_ = max_tokens;
}

llama_token llama_opt_session::next_token() {
    lock_t lock(ctx_->mutex());
    check_open();
    if (room() == 0) {
        throw llama_opt_error(llama_opt_errc::context_overflow,
            "the session fills the context (n_ctx=" + std::to_string(ctx_->n_ctx()) + ")", "n_ctx");
    }
    if (tokens_.empty()) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "the session is empty: append a prompt before generating");
    }
    if (!generating_) {
        generating_   = true;
        output_begin_ = tokens_.size();
        reserve_output_room();
    }
    if (sampler_.constrained() && ctx_->settings().config.schema_skip_enabled && n_evaluated_ > 0) {
        const llama_token inferred = sampler_.next_inferred();
        if (inferred == -2) {
            return -1;  // the grammar allows nothing more
        }
        if (inferred >= 0) {  // the grammar leaves one choice: no logits, no sampling for it
            return take_inferred(inferred);
        }
    }
    decode_pending_step();  // the pending sampled token: one decode step, not a (canonical) prefill
    ensure_logits(&llama_opt_stats::tokens_prefilled);

    const llama_token token = sampler_.pick(logits_);
    if (token < 0) {
        return -1;  // the grammar allows nothing more
    }
    if (sampler_.constrained()) {
        count(&llama_opt_stats::schema_tokens_total, 1);
    }
    sampler_.accept(token);
    tokens_.push_back(token);
    take_checked(token);
    count(&llama_opt_stats::tokens_generated, 1);
    return token;
}

llama_opt_step llama_opt_session::step() {
    lock_t lock(ctx_->mutex());
    llama_opt_step s;
    s.token = next_token();
    if (s.token >= 0) {
        s.eog   = ctx_->model().is_eog(s.token);
        s.piece = ctx_->model().token_piece(s.token, false);
    }
    s.room = room();
    return s;
}

// A token the grammar decided: it joins the history without logits or sampling; its KV is
// computed before the next real step (decode_pending_step).
llama_token llama_opt_session::take_inferred(llama_token token) {
    sampler_.accept(token);
    tokens_.push_back(token);
    take_checked(token);
    count(&llama_opt_stats::tokens_generated, 1);
    count(&llama_opt_stats::schema_tokens_total, 1);
    count(&llama_opt_stats::schema_tokens_inferred, 1);
    count(&llama_opt_stats::schema_tokens_skipped, 1);
    return token;
}

void llama_opt_session::end_turn() {
    lock_t lock(ctx_->mutex());
    drop_draft();  // the generation is over: its unconfirmed draft's cells are free again
    memo_.release();
    publish_output();
    generating_ = false;  // logits() after the turn computes the pending token alone
    output_budget_ = 0;   // the next generation passes its own (set_grammar)
    if (sampler_.constrained()) {  // the generation it constrained is over
        const llama_opt_sampler::grammar_report report = sampler_.end_generation();
        count(&llama_opt_stats::schema_check_us, report.check_us);
        count(&llama_opt_stats::schema_budget_picks, report.budget_picks);
    }
    if (ctx_->settings().config.stats_enabled) {
        (stats_ - turn_start_).print();
    }
    turn_start_ = stats_;
}
