#include "session/sync.h"

#include "kv/history-diff.h"

#include <algorithm>
#include <cmath>

void llama_opt_session_sync::sync(const std::vector<llama_token> & tokens) {
    history_.ctx().model().check_tokens(tokens.data(), tokens.size());
    history_.check_fits(tokens.size());

    const llama_opt_config & cfg = history_.ctx().settings().config;
    size_t keep = 0;  // exact reuse: the common prefix only (KV after a change depends on it)
    if (cfg.diff_enabled) {
        while (keep < history_.n_evaluated() && keep < tokens.size() && history_.tokens()[keep] == tokens[keep]) {
            ++keep;
        }
    }
    const uint64_t computed_before = counters_.stats().tokens_prefilled;
    const bool     edited          = keep < history_.n_evaluated() && keep < tokens.size();
    const std::vector<llama_opt_span_move> moves = cfg.diff_enabled && cfg.diff_reuse_shifted && edited
                                                       ? plan_shifted(tokens, keep)
                                                       : std::vector<llama_opt_span_move>();
    if (moves.empty() || !sync_shifted(tokens, keep, moves)) {
        history_.drop_kv_from(keep);
        history_.assign(tokens);
        prefill_.prefill_or_cut_back(llama_opt_session_history::npos);  // on failure: the tokens whose KV exists
    }
    if (!cfg.diff_enabled) {
        return;
    }
    const uint64_t recomputed = counters_.stats().tokens_prefilled - computed_before;
    counters_.count(&llama_opt_stats::diff_tokens_total, tokens.size());
    counters_.count(&llama_opt_stats::diff_tokens_recomputed, recomputed);
    counters_.count(&llama_opt_stats::diff_tokens_unchanged, tokens.size() - std::min<uint64_t>(recomputed, tokens.size()));
}

// Tier 2 (approximate, opt-in): after an edit, the KV of the unchanged spans that follow it is
// reused at their new positions (rows moved within the session's own aligned cells, K rotated by
// the shift: patches/0005) instead of being computed again, as CacheBlend does. Those rows were computed
// without the edit, so they are approximate; the first diff_recompute_share of each span, where
// the edit matters most, is computed again, and so is the last token (its logits are needed).
// An edit in the first block (a per-request header) changes the attention sinks every later token
// attends to: diff_recompute_share_head then (measured: docs/benchmarks.md, "The head share").
// Approximate KV never enters the block pool.
std::vector<llama_opt_span_move> llama_opt_session_sync::plan_shifted(
    const std::vector<llama_token> & tokens, size_t keep) const {
    const llama_opt_context & ctx = history_.ctx();
    const llama_opt_config &  cfg = ctx.settings().config;
    // the rest of the block the edit is in is computed again, whatever the share: the tokens
    // closest to the edit
    const size_t B          = ctx.block_size();
    const size_t first_free = (keep + B - 1) / B * B;
    const llama_opt_diff_engine engine(ctx.block_size(), cfg.diff_min_unchanged);
    const llama_opt_diff_result diff = engine.compute(history_.tokens().data(), (uint32_t) history_.n_evaluated(),
                                                      tokens.data(), (uint32_t) tokens.size());

    const float share = keep < B ? cfg.diff_recompute_share_head : cfg.diff_recompute_share;
    std::vector<llama_opt_span_move> moves;
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

bool llama_opt_session_sync::sync_shifted(const std::vector<llama_token> & tokens, size_t keep,
                                          const std::vector<llama_opt_span_move> & moves) {
    llama_opt_kv_memory & memory = history_.ctx().memory();
    history_.drop_draft();  // its cells would take room the moves may need
    const llama_opt_in_place in_place = memory.park(history_.seq(), keep, history_.n_evaluated(), tokens.size(), moves);
    if (in_place != llama_opt_in_place::possible) {
        counters_.count(in_place == llama_opt_in_place::unsupported ? &llama_opt_stats::diff_shift_fallbacks_unsupported
                        : in_place == llama_opt_in_place::shared    ? &llama_opt_stats::diff_shift_fallbacks_shared
                                                                    : &llama_opt_stats::diff_shift_fallbacks_room, 1);
        return false;
    }
    history_.drop_kv_from(keep);  // the rest of the old KV (the parked rows are the scratch sequence's)
    history_.assign(tokens);
    history_.mark_approximate_from(history_.n_evaluated());
    // Every span joins the sequence first; then the tokens around them are computed in one series of
    // batches, at positions between the spans (patches/0012): a batch per gap was 1.3-2x the time per
    // token (docs/benchmarks.md, issue 23).
    memory.unpark(history_.seq());
    std::vector<size_t> positions;
    size_t              pos     = history_.n_evaluated();
    size_t              shifted = 0;
    for (const llama_opt_span_move & m : moves) {  // in position order
        for (; pos < m.to; ++pos) {
            positions.push_back(pos);
        }
        pos = m.to + m.n;
        shifted += m.n;
    }
    for (; pos < history_.size(); ++pos) {
        positions.push_back(pos);  // the last token at least (plan_shifted leaves it out of every span)
    }
    try {
        history_.compute_at(positions, &llama_opt_stats::tokens_prefilled, true);
        history_.computed(history_.size());
        counters_.count(&llama_opt_stats::diff_tokens_shifted, shifted);
    } catch (const llama_opt_error & e) {
        history_.drop_joined_spans();
        if (e.code != llama_opt_errc::context_overflow) {
            throw;
        }
        // not expected (the memory's park found the room): exact mode's work, which can relocate
        counters_.count(&llama_opt_stats::diff_shift_fallbacks_room, 1);
        history_.drop_kv_from(std::min(history_.n_evaluated(), keep));
        history_.assign(tokens);
        prefill_.prefill_or_cut_back(llama_opt_session_history::npos);
    }
    return true;
}
