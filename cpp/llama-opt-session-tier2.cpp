// llama-opt-session, Tier 2: the methods that take KV out of attention (off by default).
//
// - drop_span: the KV of a span leaves the sequence (its cells are freed; the positions of the
//   rest stay, so RoPE distances are unchanged). The sink + recent window baseline is built on it.
// - sparse attention over tool results (000 §4.2, sparse_attn_enabled): before a query is
//   computed, each earlier tool result is scored against it (llama_opt_sparse_scorer) and its
//   irrelevant spans are dropped; its first and last tokens always stay.
// - attention-sink pruning (000 §4.1, attn_prune_enabled): after a turn is computed, the
//   attention of its last queries over every key (live and cold) is scored on the host
//   (llama-opt-attn-capture); cold blocks that score like kept ones come back (and the turn is
//   computed again to see them), then the per-block rolling statistics are updated and blocks
//   below the threshold for the window (or the weakest, over a budget) move to cold storage:
//   their KV rows in RAM, their cells freed. Never the first block (attention sinks), the system
//   prompt, the current turn or the last attn_prune_recent tokens.
// - speculative prefill (001, spec_prefill_enabled): a prompt of spec_prefill_min_tokens or more
//   is scored first (the model's first spec_prefill_layers layers, llama_opt_spec_score_span,
//   or a draft model, llama-opt-spec-prefill), and only the tokens kept (llama_opt_spec_keep: the
//   top spec_prefill_keep share, the last token always) are computed, at their own positions
//   (patches/0011); the others are holes from the start, as if dropped by drop_span.
//
// A session with a hole is approximate from the hole on (approx_from): its KV is never pooled,
// shared by a fork or persisted (those take complete blocks below n_canonical, kept below it).

#include "llama-opt-session.h"

#include "llama-opt-h2o-prefill.h"

#include <algorithm>
#include <chrono>
#include <climits>

using lock_t = std::lock_guard<std::recursive_mutex>;
using span_t = std::pair<size_t, size_t>;

// [a, b) into a sorted list of disjoint spans, merged with those it touches
static void span_add(std::vector<span_t> & spans, size_t a, size_t b) {
    std::vector<span_t> out;
    for (const span_t & s : spans) {
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

// removes [a, b) from a sorted list of disjoint spans
static void span_subtract(std::vector<span_t> & spans, size_t a, size_t b) {
    std::vector<span_t> out;
    for (const span_t & s : spans) {
        if (s.first < a) {
            out.emplace_back(s.first, std::min(s.second, a));
        }
        if (s.second > b) {
            out.emplace_back(std::max(s.first, b), s.second);
        }
    }
    spans = std::move(out);
}

const llama_opt_config & llama_opt_session::tier2() const {
    return tier2_ ? *tier2_ : ctx_->settings().config;
}

void llama_opt_session::set_tier2(const llama_opt_config & config) {
    lock_t lock(ctx_->mutex());
    check_open();
    if (config.attn_prune_enabled && !ctx_->attn_capture()) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "attention-sink pruning needs a context made with attn_prune_enabled (the model's queries are "
            "observed through the eval callback, which is set when the context is made)", "attn_prune_enabled");
    }
    if (config.spec_prefill_enabled && !ctx_->attn_capture() && !ctx_->spec_draft()) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "speculative prefill needs a context made with spec_prefill_enabled (its scorer observes the model's "
            "queries and keys through the eval callback, set when the context is made, or loads the draft model)",
            "spec_prefill_enabled");
    }
    tier2_ = std::make_unique<llama_opt_config>(config);
}

void llama_opt_session::copy_tier2_to(llama_opt_session & fork) const {
    if (tier2_) {
        fork.tier2_ = std::make_unique<llama_opt_config>(*tier2_);
    }
    fork.system_end_ = system_end_;
    fork.tool_spans_ = tool_spans_;
}

std::vector<span_t> llama_opt_session::holes() const {
    lock_t lock(ctx_->mutex());
    return holes_;
}

size_t llama_opt_session::n_cold() const {
    lock_t lock(ctx_->mutex());
    return cold_.size() * ctx_->block_size();
}

bool llama_opt_session::in_hole(size_t pos) const {
    auto it = std::upper_bound(holes_.begin(), holes_.end(), span_t(pos, SIZE_MAX));
    return it != holes_.begin() && std::prev(it)->second > pos;
}

std::vector<span_t> llama_opt_session::live_ranges() const {
    std::vector<span_t> live = { { 0, n_evaluated_ } };
    for (const span_t & h : holes_) {
        span_subtract(live, h.first, h.second);
    }
    return live;
}

void llama_opt_session::drop_cells(size_t p0, size_t p1) {
    ctx_->memory().drop(seq_, p0, p1);
    span_add(holes_, p0, p1);
    approx_from_ = std::min(approx_from_, p0);
    const size_t B = ctx_->block_size();
    n_canonical_   = std::min(n_canonical_, p0 / B * B);  // the exact prefix: what forks and the disk tier take
    chain_.resize(std::min(chain_.size(), n_canonical_ / B));
    logits_for_ = 0;  // the logits are computed again with the KV that is left
}

void llama_opt_session::drop_span(size_t p0, size_t p1) {
    lock_t lock(ctx_->mutex());
    check_open();
    if (p0 > p1) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            "drop_span needs start <= end, got " + std::to_string(p0) + " > " + std::to_string(p1));
    }
    drop_draft();
    p1 = std::min(p1, n_evaluated_ > 0 ? n_evaluated_ - 1 : 0);  // the last token keeps its KV
    if (p0 >= p1) {
        return;
    }
    const size_t B = ctx_->block_size();
    for (auto it = cold_.begin(); it != cold_.end();) {  // an explicit drop is final
        it = it->first * B < p1 && (it->first + 1) * B > p0 ? cold_.erase(it) : std::next(it);
    }
    for (const span_t & live : live_ranges()) {
        const size_t a = std::max(p0, live.first), b = std::min(p1, live.second);
        if (a < b) {
            drop_cells(a, b);
        }
    }
}

void llama_opt_session::forget_holes(size_t pos) {
    span_subtract(holes_, pos, SIZE_MAX);
    const size_t B = ctx_->block_size();
    for (auto it = cold_.begin(); it != cold_.end();) {  // a block cut in part cannot come back whole
        it = (it->first + 1) * B > pos ? cold_.erase(it) : std::next(it);
    }
    pruner_.truncate(pos / B);
    // the marks of tool results and of the system prompt are the history's (its tokens stay
    // when only their KV goes): append() cuts them to the history's length
}

// Words whose tokens mark structure in tool output (000 §4.2's structural heuristic).
static std::vector<llama_token> cue_tokens(const llama_opt_model & model) {
    static const char * words[] = { "error", "Error", "ERROR", "Traceback", "Exception", "FAILED", "failed",
                                    "warning", "Warning", "def", "class", "function", "raise", "assert" };
    std::vector<llama_token> out;
    for (const char * w : words) {
        for (const std::string & text : { std::string(w), " " + std::string(w) }) {
            const std::vector<llama_token> t = model.tokenize(text, false, false);
            if (t.size() == 1) {  // a word split in pieces would mark generic pieces
                out.push_back(t[0]);
            }
        }
    }
    return out;
}

void llama_opt_session::drop_irrelevant_tool_spans(const std::vector<llama_token> & query) {
    const llama_opt_config & cfg = tier2();
    llama_opt_sparse_params params;
    params.threshold  = cfg.sparse_relevance_threshold;
    params.span       = cfg.sparse_attn_span;
    params.keep_edges = cfg.sparse_attn_keep_edges;
    params.budget     = cfg.sparse_attn_budget;
    const llama_opt_sparse_scorer scorer(params, cue_tokens(ctx_->model()));
    for (const span_t & tool : tool_spans_) {
        const uint32_t n = (uint32_t) (tool.second - tool.first);
        const auto spans = scorer.score(tokens_.data() + tool.first, n, query.data(), (uint32_t) query.size());
        for (const llama_opt_relevance_span & d : scorer.drops(spans, n)) {
            const size_t p0 = tool.first + d.start;
            const size_t p1 = std::min(p0 + d.length, n_evaluated_ > 0 ? n_evaluated_ - 1 : 0);
            if (p0 < p1) {
                drop_cells(p0, p1);
                count(&llama_opt_stats::sparse_spans_dropped, 1);
                count(&llama_opt_stats::sparse_tokens_dropped, p1 - p0);
            }
        }
    }
}

void llama_opt_session::append(const std::vector<llama_token> & tokens, llama_opt_span_kind kind) {
    lock_t lock(ctx_->mutex());
    check_open();
    append_marked(tokens, kind, /* score_tools */ true);
}

void llama_opt_session::sync(const std::vector<llama_token> & tokens, const std::vector<span_t> & tool_spans) {
    lock_t lock(ctx_->mutex());
    check_open();
    size_t end = 0;
    for (const span_t & s : tool_spans) {
        if (s.first < end || s.first >= s.second || s.second > tokens.size()) {
            throw llama_opt_error(llama_opt_errc::invalid_argument,
                "tool spans must be non-empty [start, end) ranges of the tokens, sorted and disjoint; got [" +
                std::to_string(s.first) + ", " + std::to_string(s.second) + ") after one ending at " +
                std::to_string(end) + " (" + std::to_string(tokens.size()) + " tokens)");
        }
        end = s.second;
    }
    size_t common = 0;
    while (common < tokens_.size() && common < tokens.size() && tokens_[common] == tokens[common]) {
        ++common;
    }
    // the marks already in the history were scored (or left unmarked) when they were appended
    const auto first = std::find_if(tool_spans.begin(), tool_spans.end(), [&](const span_t & s) { return s.second > common; });
    if (!tier2().sparse_attn_enabled || first == tool_spans.end()) {
        sync(tokens);
        return;
    }
    ctx_->model().check_tokens(tokens.data(), tokens.size());  // before the history changes
    check_fits(tokens.size());
    auto piece = [&](size_t a, size_t b) {
        return std::vector<llama_token>(tokens.begin() + (std::ptrdiff_t) a, tokens.begin() + (std::ptrdiff_t) b);
    };
    size_t pos = std::min(common, first->first);
    sync(piece(0, pos));
    for (auto s = first; s != tool_spans.end(); ++s) {
        if (pos < s->first) {
            append_marked(piece(pos, s->first), llama_opt_span_kind::text, /* score_tools */ false);
        }
        append_marked(piece(s->first, s->second), llama_opt_span_kind::tool, false);
        pos = s->second;
    }
    if (pos < tokens.size()) {
        append_marked(piece(pos, tokens.size()), llama_opt_span_kind::text, true);
    }
}

void llama_opt_session::append_marked(const std::vector<llama_token> & tokens, llama_opt_span_kind kind,
                                      bool score_tools) {
    ctx_->model().check_tokens(tokens.data(), tokens.size());  // before anything is dropped
    check_fits(tokens_.size() + tokens.size());
    const llama_opt_config & cfg = tier2();
    const size_t begin = tokens_.size();
    span_subtract(tool_spans_, begin, SIZE_MAX);  // the history was cut since they were marked
    system_end_ = std::min(system_end_, begin);
    if (kind != llama_opt_span_kind::tool && !tokens.empty() && score_tools) {
        if (cfg.sparse_attn_enabled && !tool_spans_.empty()) {
            if (n_evaluated_ < tokens_.size()) {  // a fork's tail, a pending token: their KV first
                prefill_or_cut_back(tokens_.size());
            }
            drop_irrelevant_tool_spans(tokens);
        }
        tool_spans_.clear();  // each tool result is scored once, against the query that follows it
    }
    llama_opt_attn_capture * capture = cfg.attn_prune_enabled ? ctx_->attn_capture() : nullptr;
    if (capture) {
        capture->arm();
    }
    try {
        append(tokens);
    } catch (...) {
        if (capture) {
            capture->disarm();
        }
        throw;
    }
    if (capture) {
        capture->disarm();
    }
    if (kind == llama_opt_span_kind::system) {
        system_end_ = std::max(system_end_, tokens_.size());
    }
    if (kind == llama_opt_span_kind::tool && begin < tokens_.size()) {  // kept for a fork that turns sparse_attn on
        tool_spans_.emplace_back(begin, tokens_.size());  // two results in a row stay two
    }
    if (capture && capture->available() && !tokens.empty()) {
        prune_turn(begin);
    }
}

// The keys of the live positions, then those of the cold blocks (in block order).
static void read_keys(llama_opt_context & ctx, int32_t seq, const llama_opt_attn_capture & capture,
                      const std::vector<span_t> & live, const std::map<size_t, std::vector<uint8_t>> & cold,
                      llama_opt_attn_keys & keys) {
    constexpr size_t       chunk  = 256;  // positions per read: bounded scratch memory
    const size_t           stride = capture.row_stride();
    std::vector<uint8_t>   rows(chunk * stride);
    std::vector<llama_pos> pos;
    auto add = [&](size_t p0, size_t n, const uint8_t * r) {
        pos.resize(n);
        for (size_t i = 0; i < n; ++i) {
            pos[i] = (llama_pos) (p0 + i);
        }
        keys.add(capture, pos.data(), n, r, stride);
    };
    for (const span_t & s : live) {
        for (size_t a = s.first; a < s.second; a += chunk) {
            const size_t b = std::min(s.second, a + chunk);
            if (!ctx.memory().read(seq, a, b, rows.data())) {
                throw llama_opt_error(llama_opt_errc::decode_failed,
                    "attention scores: the KV rows of positions " + std::to_string(a) + ".." + std::to_string(b) +
                    " could not be read");
            }
            add(a, b - a, rows.data());
        }
    }
    const size_t B = ctx.block_size();
    for (const auto & c : cold) {
        add(c.first * B, B, c.second.data());
    }
}

llama_opt_attn_probe llama_opt_session::attention_probe() {
    lock_t lock(ctx_->mutex());
    check_open();
    const llama_opt_attn_capture * capture = ctx_->attn_capture();
    if (!capture || !capture->available()) {
        throw llama_opt_error(llama_opt_errc::invalid_argument,
            capture ? "attention scores are not available for this model's KV cache layout (F16 K rows expected)"
                    : "attention scores need a context made with attn_prune_enabled (the model's queries are "
                      "observed through the eval callback, which is set when the context is made)",
            "attn_prune_enabled");
    }
    llama_opt_attn_probe probe;
    llama_opt_attn_keys  keys;
    read_keys(*ctx_, seq_, *capture, live_ranges(), {}, keys);
    probe.shape  = capture->shape();
    probe.layers = capture->layers();
    for (uint32_t r = 0; r < capture->n_rows(); ++r) {
        probe.q_pos.push_back((llama_pos) (n_evaluated_ - capture->n_rows() + r));
    }
    for (size_t i = 0; i < probe.layers.size(); ++i) {
        probe.q.insert(probe.q.end(), capture->queries(i).begin(), capture->queries(i).end());
        probe.k.insert(probe.k.end(), keys.k[i].begin(), keys.k[i].end());
    }
    probe.k_pos  = keys.pos;
    probe.scores = llama_opt_attn_score(*capture, keys, n_evaluated_);
    return probe;
}

bool llama_opt_session::restore_block(size_t block) {
    const size_t B  = ctx_->block_size();
    auto         it = cold_.find(block);
    if (it == cold_.end() || !ctx_->memory().write(seq_, block * B, (block + 1) * B, it->second.data())) {
        return false;  // no room where the placement needs it: the block stays cold
    }
    cold_.erase(it);
    span_subtract(holes_, block * B, (block + 1) * B);
    pruner_.set_evicted((uint32_t) block, false);
    count(&llama_opt_stats::attn_blocks_restored, 1);
    count(&llama_opt_stats::attn_tokens_restored, B);
    return true;
}

void llama_opt_session::prune_turn(size_t turn_begin) {
    const auto                     t0      = std::chrono::steady_clock::now();
    const llama_opt_config &       cfg     = tier2();
    const llama_opt_attn_capture & capture = *ctx_->attn_capture();
    const size_t                   B       = ctx_->block_size();
    const size_t                   end     = n_evaluated_;
    if (capture.n_rows() == 0 || end < B) {
        return;
    }
    pruner_.set_limits(cfg.attn_prune_threshold, cfg.attn_prune_window);
    llama_opt_attn_keys keys;
    read_keys(*ctx_, seq_, capture, live_ranges(), cold_, keys);
    const std::vector<float> scores = llama_opt_attn_score(capture, keys, end);
    count(&llama_opt_stats::attn_keys_scored, keys.pos.size());

    // attention mass per block; a block is live if none of it is in a hole
    const size_t       n_blocks = (end + B - 1) / B;
    std::vector<float> mass(n_blocks, 0.0f);
    for (size_t i = 0; i < keys.pos.size(); ++i) {
        mass[keys.pos[i] / B] += scores[i];
    }
    // guarded: the first block (attention sinks) and the system prompt; the current turn and the
    // most recent tokens
    const size_t first  = std::max<size_t>(1, (system_end_ + B - 1) / B);
    const size_t recent = end > cfg.attn_prune_recent ? end - cfg.attn_prune_recent : 0;
    const size_t last   = std::min(recent, turn_begin) / B;
    auto whole_live = [&](size_t b) {
        return !cold_.count(b) && std::none_of(holes_.begin(), holes_.end(), [&](const span_t & h) {
            return h.first < (b + 1) * B && h.second > b * B;
        });
    };
    float weakest = 1.0f;  // the least attended block that stays
    for (size_t b = first; b < last; ++b) {
        if (whole_live(b)) {
            weakest = std::min(weakest, mass[b]);
        }
    }
    // restore: cold blocks the turn attends to as much as to a kept one (strongest first)
    std::vector<size_t> cold_blocks;
    for (const auto & c : cold_) {
        cold_blocks.push_back(c.first);
    }
    std::sort(cold_blocks.begin(), cold_blocks.end(), [&](size_t a, size_t b) { return mass[a] > mass[b]; });
    bool restored = false;
    for (size_t b : cold_blocks) {
        if (mass[b] >= std::max(cfg.attn_prune_threshold, weakest) && restore_block(b)) {
            restored = true;
        }
    }
    if (restored) {  // the turn's tokens computed again, now seeing the restored blocks
        forget(turn_begin);
        prefill(&llama_opt_stats::tokens_prefilled);
        count(&llama_opt_stats::attn_tokens_recomputed, end - turn_begin);
    }
    std::vector<float> live_mass(mass);
    for (const auto & c : cold_) {
        live_mass[c.first] = 0.0f;  // not attended: cold (update() leaves evicted blocks alone)
    }
    pruner_.update(live_mass);

    size_t budget = SIZE_MAX;  // blocks of [first, last) that may stay
    if (cfg.attn_prune_budget > 0.0f) {
        size_t live_total = 0, live_eligible = 0;
        for (const span_t & s : live_ranges()) {
            live_total += s.second - s.first;
        }
        for (size_t b = first; b < last; ++b) {
            live_eligible += whole_live(b) ? B : 0;
        }
        const size_t allowed = (size_t) (cfg.attn_prune_budget * (double) end);
        const size_t outside = live_total - live_eligible;
        budget               = allowed > outside ? (allowed - outside) / B : 0;
    }
    const size_t stride = ctx_->attn_capture()->row_stride();
    for (uint32_t b : pruner_.eviction_candidates(first, last, budget)) {
        if (!whole_live(b)) {
            continue;
        }
        std::vector<uint8_t> rows(B * stride);
        if (!ctx_->memory().read(seq_, b * B, (b + 1) * B, rows.data())) {
            continue;
        }
        cold_[b] = std::move(rows);
        drop_cells(b * B, (b + 1) * B);
        pruner_.set_evicted(b, true);
        count(&llama_opt_stats::attn_blocks_pruned, 1);
        count(&llama_opt_stats::attn_tokens_pruned, B);
    }
    count(&llama_opt_stats::attn_score_us,
          (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
}

//
// H2O chunked sparse prefill (docs/h2o.md): the context computes, the session counts and marks
// itself approximate from the prompt's first position (prefill sets approx_from_)
//

bool llama_opt_session::uses_h2o(size_t end) const {
    const llama_opt_config & cfg = ctx_->settings().config;  // the context's: it observes the graph for H2O
    return cfg.h2o_enabled && n_evaluated_ == 0 && end > cfg.h2o_chunk_size;
}

void llama_opt_session::compute_h2o(size_t end) {
    llama_opt_work     work;
    llama_opt_h2o_work h2o;
    auto               count_all = [&] {
        count_work(&llama_opt_stats::tokens_prefilled, work);
        count(&llama_opt_stats::h2o_chunks, h2o.chunks);
        count(&llama_opt_stats::h2o_tokens_kept, h2o.tokens_kept);
        count(&llama_opt_stats::h2o_select_us, h2o.select_us);
    };
    try {
        llama_opt_h2o_prefill(*ctx_, seq_, tokens_.data(), end, &logits_, work, h2o);
    } catch (...) {
        count_all();  // the chunks computed before the failure: thrown away, but done
        throw;
    }
    count_all();
    logits_for_ = end;
}

//
// Speculative prefill (specification 001): a scorer picks the prompt tokens worth computing; the
// dropped ones become holes, the session approximate from the first of them
//

bool llama_opt_session::spec_prefill(size_t end, uint64_t llama_opt_stats::* counter) {
    const llama_opt_config & cfg   = tier2();
    const size_t             begin = n_evaluated_;
    if (!cfg.spec_prefill_enabled || counter != &llama_opt_stats::tokens_prefilled ||
        end - begin < std::max<size_t>(2, cfg.spec_prefill_min_tokens)) {
        return false;
    }
    const auto     t0    = std::chrono::steady_clock::now();
    const bool     evict = !ctx_->canonical();
    llama_opt_work scorer;
    std::vector<float> importance;
    auto count_scoring = [&] {
        count(&llama_opt_stats::spec_prefill_tokens_scored, scorer.tokens);
        count(&llama_opt_stats::forward_passes, scorer.passes);
        count(&llama_opt_stats::forward_us, scorer.us);
        count(&llama_opt_stats::spec_prefill_score_us,
              (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
                  .count());
    };
    try {
        if (llama_opt_spec_draft * draft = ctx_->spec_draft()) {  // the draft sees the whole history
            importance = draft->importance(tokens_.data(), end, cfg.spec_prefill_window, cfg.spec_prefill_last_layers,
                                           cfg.spec_prefill_pool, scorer.passes);
            scorer.tokens = end;
            importance.erase(importance.begin(), importance.begin() + std::min(begin, importance.size()));
        } else {  // the model's first layers, on top of the KV the session has
            importance = llama_opt_spec_score_span(*ctx_, seq_, tokens_.data(), begin, end, cfg.spec_prefill_layers,
                                          cfg.spec_prefill_window, cfg.spec_prefill_last_layers, cfg.spec_prefill_pool,
                                          evict, scorer);
        }
    } catch (...) {
        count_scoring();
        throw;
    }
    count_scoring();
    if (importance.size() != end - begin) {
        return false;  // no scores (a model whose tensors the scorer does not know): computed whole
    }
    count(&llama_opt_stats::spec_prefill_prompts, 1);
    std::vector<uint32_t> keep = llama_opt_spec_keep(importance, cfg.spec_prefill_keep, cfg.spec_prefill_window);
    // the next step decodes the history's last token again, right after the one before it: that one
    // needs its KV (dropped, with a window of 1 or keep 0, the session could not generate)
    const uint32_t before_last = (uint32_t) importance.size() - 2;
    if (importance.size() >= 2 && !std::binary_search(keep.begin(), keep.end(), before_last)) {
        keep.insert(keep.end() - 1, before_last);  // (sorted: the last index stays last)
    }
    count(&llama_opt_stats::spec_prefill_tokens_kept, keep.size());
    count(&llama_opt_stats::spec_prefill_tokens_dropped, importance.size() - keep.size());
    if (keep.size() == importance.size()) {
        return false;  // everything kept: exact prefill
    }
    std::vector<size_t> positions(keep.size());
    for (size_t i = 0; i < keep.size(); ++i) {
        positions[i] = begin + keep[i];
    }
    compute_at(positions, counter, evict);
    size_t next = begin;  // the dropped tokens: holes, the session approximate from the first
    for (size_t p : positions) {
        if (p > next) {
            drop_cells(next, p);
        }
        next = p + 1;
    }
    return true;  // the logits after end: its last token is always kept
}
