#include "session/prefill.h"

#include <algorithm>
#include <chrono>

void llama_opt_session_prefill::append(const std::vector<llama_token> & tokens) {
    history_.ctx().model().check_tokens(tokens.data(), tokens.size());
    history_.check_fits(history_.size() + tokens.size());
    history_.drop_draft();
    const size_t old_size = history_.size();
    history_.append(tokens);
    prefill_or_cut_back(old_size);  // on failure: the old history
}

void llama_opt_session_prefill::prefill_or_cut_back(size_t keep) {
    try {
        prefill(&llama_opt_stats::tokens_prefilled);
    } catch (...) {
        if (keep == llama_opt_session_history::npos) {
            keep = history_.n_evaluated();
        }
        history_.drop_kv_from(std::min(history_.n_evaluated(), keep));  // KV beyond it (e.g. a prefix taken from another sequence) goes
        history_.cut_tokens(keep);
        throw;
    }
}

void llama_opt_session_prefill::prefill(uint64_t llama_opt_stats::* counter) {
    llama_opt_context & ctx = history_.ctx();
    const size_t end = history_.size();
    const bool   h2o = uses_h2o(end);
    if (h2o) {
        history_.mark_approximate_from(0);  // Tier 2: the whole prompt is computed by H2O's chunks (docs/h2o.md)
    }
    // an approximate session (Tier 2) keeps its KV as it is and is never pooled beyond n_canonical
    bool canonical = ctx.canonical() && !history_.approximate();
    if (canonical && ctx.settings().config.diff_reuse_generated && history_.n_canonical() < history_.n_evaluated() &&
        history_.n_evaluated() < end) {
        // Tier 2: the rows computed off the canonical schedule (generated tokens, decoded one at a
        // time; the last rows of a chunk) stay, as llama.cpp's own prefix reuse keeps them
        history_.mark_approximate_from(history_.n_canonical());
        canonical = false;
    }
    if (canonical) {
        // what is not canonical (generated tokens, the last rows of a chunk) is computed again
        history_.drop_kv_from(std::min(history_.n_canonical(), llama_opt_reusable_prefix(end, ctx)));
        if (ctx.memory().dedup()) {
            reuse_.adopt_shared_prefix();
        }
        reuse_.restore_from_disk(end);
    }
    if (history_.n_evaluated() < end) {
        // canonical: the room is found before anything is computed (a chunk that failed for want of
        // it would throw the chunks before it away)
        if (ctx.canonical() && !room_.room_or_bottom(end)) {
            throw ctx.memory().full_error();
        }
        if (h2o) {
            history_.compute_h2o(end);
        } else if (!spec_prefill(end, counter)) {
            history_.compute(history_.n_evaluated(), end, counter, /* evict_sessions */ !ctx.canonical());
        }
        history_.computed(end);
    }
    if (ctx.canonical() && !history_.approximate()) {  // a relocation (above) computed an approximate session exactly
        reuse_.computed_canonically(end);
    }
}

void llama_opt_session_prefill::ensure_logits(uint64_t llama_opt_stats::* counter) {
    llama_opt_context & ctx = history_.ctx();
    if (history_.empty()) {
        history_.clear_logits();
        return;
    }
    if (history_.n_evaluated() < history_.size()) {
        if (ctx.canonical()) {
            prefill(counter);
        } else {
            history_.compute(history_.n_evaluated(), history_.size(), counter, true);
            history_.computed(history_.size());
        }
    }
    if (!history_.logits_current() && history_.n_evaluated() > 0) {
        // the history was cut back: compute its end again (canonical: a whole last chunk)
        history_.drop_kv_from(ctx.canonical() && !history_.approximate()
                                  ? llama_opt_reusable_prefix(history_.n_evaluated(), ctx)
                                  : history_.n_evaluated() - 1);
        ensure_logits(counter);
    }
}

void llama_opt_session_prefill::compute_afresh(const std::vector<llama_token> & tokens,
                                               const llama_opt_row_logits & each_row) {
    llama_opt_context & ctx = history_.ctx();
    ctx.model().check_tokens(tokens.data(), tokens.size());
    history_.check_fits(tokens.size());
    history_.drop_draft();
    history_.drop_kv_from(0);  // (an approximate session is exact again)
    history_.cut_tokens(0);
    history_.clear_logits();
    history_.append(tokens);
    const size_t end = tokens.size();
    try {
        if (ctx.canonical() && !room_.room_or_bottom(end)) {
            throw ctx.memory().full_error();
        }
        history_.compute(0, end, &llama_opt_stats::tokens_prefilled, /* evict_sessions */ !ctx.canonical(),
                         /* logits */ false, each_row);
        history_.computed(end);
    } catch (...) {
        history_.drop_kv_from(0);
        history_.cut_tokens(0);
        throw;
    }
    if (ctx.canonical()) {
        reuse_.computed_canonically(end);
    }
}

bool llama_opt_session_prefill::uses_h2o(size_t end) const {
    const llama_opt_config & cfg = history_.ctx().settings().config;  // the context's: it observes the graph for H2O
    return cfg.h2o_enabled && history_.n_evaluated() == 0 && end > cfg.h2o_chunk_size;
}

// Speculative prefill (specification 001): a scorer picks the prompt tokens worth computing: the
// model's first spec_prefill_layers layers (llama_opt_spec_score_span) or a draft model
// (methods/spec-prefill); only the tokens kept (llama_opt_spec_keep: the top spec_prefill_keep
// share, the last token always) are computed, at their own positions (patches/0011); the others are
// holes from the start, as if dropped by drop_span, the session approximate from the first of them.
bool llama_opt_session_prefill::spec_prefill(size_t end, uint64_t llama_opt_stats::* counter) {
    llama_opt_context &      ctx   = history_.ctx();
    const llama_opt_config & cfg   = approx_.get();
    const size_t             begin = history_.n_evaluated();
    if (!cfg.spec_prefill_enabled || counter != &llama_opt_stats::tokens_prefilled ||
        end - begin < std::max<size_t>(2, cfg.spec_prefill_min_tokens)) {
        return false;
    }
    const auto     t0    = std::chrono::steady_clock::now();
    const bool     evict = !ctx.canonical();
    llama_opt_work scorer;
    std::vector<float> importance;
    llama_opt_finally(
        [&] {
            if (llama_opt_spec_draft * draft = ctx.spec_draft()) {  // the draft sees the whole history
                importance = draft->importance(history_.tokens().data(), end, cfg.spec_prefill_window,
                                               cfg.spec_prefill_last_layers, cfg.spec_prefill_pool, scorer.passes);
                scorer.tokens = end;
                importance.erase(importance.begin(), importance.begin() + std::min(begin, importance.size()));
            } else {  // the model's first layers, on top of the KV the session has
                importance = llama_opt_spec_score_span(ctx, history_.seq(), history_.tokens().data(), begin, end,
                                                       cfg.spec_prefill_layers, cfg.spec_prefill_window,
                                                       cfg.spec_prefill_last_layers, cfg.spec_prefill_pool, evict, scorer);
            }
        },
        [&] {
            counters_.count_work(&llama_opt_stats::spec_prefill_tokens_scored, scorer);
            counters_.count(&llama_opt_stats::spec_prefill_score_us,
                            (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::steady_clock::now() - t0).count());
        });
    if (importance.size() != end - begin) {
        return false;  // no scores (a model whose tensors the scorer does not know): computed whole
    }
    counters_.count(&llama_opt_stats::spec_prefill_prompts, 1);
    std::vector<uint32_t> keep = llama_opt_spec_keep(importance, cfg.spec_prefill_keep, cfg.spec_prefill_window);
    // the next step decodes the history's last token again, right after the one before it: that one
    // needs its KV (dropped, with a window of 1 or keep 0, the session could not generate)
    const uint32_t before_last = (uint32_t) importance.size() - 2;
    if (importance.size() >= 2 && !std::binary_search(keep.begin(), keep.end(), before_last)) {
        keep.insert(keep.end() - 1, before_last);  // (sorted: the last index stays last)
    }
    counters_.count(&llama_opt_stats::spec_prefill_tokens_kept, keep.size());
    counters_.count(&llama_opt_stats::spec_prefill_tokens_dropped, importance.size() - keep.size());
    if (keep.size() == importance.size()) {
        return false;  // everything kept: exact prefill
    }
    std::vector<size_t> positions(keep.size());
    for (size_t i = 0; i < keep.size(); ++i) {
        positions[i] = begin + keep[i];
    }
    history_.compute_at(positions, counter, evict);
    size_t next = begin;  // the dropped tokens: holes, the session approximate from the first
    for (size_t p : positions) {
        if (p > next) {
            history_.drop_kv(next, p);
        }
        next = p + 1;
    }
    return true;  // the logits after end: its last token is always kept
}
