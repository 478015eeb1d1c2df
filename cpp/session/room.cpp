#include "session/room.h"

#include <algorithm>

// Room for the history to grow to `end` tokens: KV above its cells evicted (cached sequences); if its
// cells (or a prefix taken from another sequence) sit too high for that although there may be room
// below, the history is dropped (computed again from the bottom by the caller, without shared
// cells) and room for all of it made, letting idle sessions go if needed.
bool llama_opt_session_room::room_or_bottom(size_t end) {
    llama_opt_context & ctx = history_.ctx();
    if (ctx.memory().make_room(history_.seq(), history_.n_evaluated(), end, /* evict_sessions */ false)) {
        return true;
    }
    history_.drop_kv_from(0);
    return ctx.memory().make_room(history_.seq(), 0, end, /* evict_sessions */ true);
}

// A history placed in the cache's top tiles (the free ones when it came) could not grow mid-answer
// although the cache had room below: the answer ended as "context full". Before the first token the
// room is found as prefill finds its own: KV above evicted (cached blocks), else the history computed
// again from the bottom (the same chunks: the same bits), letting idle sessions go if needed. Only a
// history with no empty tile above it at all (a history that has one grows as before: nothing is freed
// for room an answer may not use); up to OUTPUT_ROOM_RESERVED tokens of the budget: a longer answer
// that meets the top later moves down then (move_answer_down), which costs its tokens computed again too.
static constexpr size_t OUTPUT_ROOM_RESERVED = 512;

void llama_opt_session_room::reserve_output_room(uint32_t budget) {
    llama_opt_context & ctx = history_.ctx();
    const size_t n = history_.size();
    if (!ctx.canonical() || history_.approximate() || history_.n_evaluated() != n || n == 0) {
        return;
    }
    const size_t end = std::min<size_t>(n + std::min<size_t>(budget, OUTPUT_ROOM_RESERVED), ctx.n_ctx());
    if (end <= n || ctx.memory().tile_above(history_.seq()) || (room_or_bottom(end) && history_.n_evaluated() == n)) {
        return;
    }
    ctx.memory().make_room(history_.seq(), 0, n, /* evict_sessions */ true);  // without room for the answer: the history's (it had it)
    history_.compute(0, n, &llama_opt_stats::tokens_prefilled, /* evict_sessions */ true);
    history_.computed(n);
    reuse_.computed_canonically(n);
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
void llama_opt_session_room::move_answer_down(size_t output_begin, uint32_t budget) {
    llama_opt_context & ctx = history_.ctx();
    const size_t n = history_.size();
    if (!ctx.canonical() || history_.approximate() || history_.n_evaluated() < output_begin ||
        ctx.memory().make_room(history_.seq(), history_.n_evaluated(), n, /* evict_sessions */ true)) {
        return;
    }
    const size_t generated = n - output_begin;
    const size_t left      = budget > generated ? budget - generated : 0;
    const size_t end       = std::min<size_t>(n + std::min(left, OUTPUT_ROOM_RESERVED), ctx.n_ctx());
    if (!ctx.memory().room_after_drop(history_.seq(), end)) {
        return;
    }
    const size_t evaluated = history_.n_evaluated();
    history_.drop_kv_from(0);
    if (!ctx.memory().make_room(history_.seq(), 0, end, /* evict_sessions */ true)) {
        throw ctx.memory().full_error();  // (checked above: not expected)
    }
    // without logits: the last ones, which sampled the pending token, stay
    history_.compute(0, output_begin, &llama_opt_stats::tokens_prefilled, /* evict_sessions */ true, /* logits */ false);
    history_.computed(output_begin);
    reuse_.computed_canonically(output_begin);
    while (history_.n_evaluated() < evaluated) {
        const size_t stop = std::min<size_t>(evaluated, history_.n_evaluated() + LLAMA_OPT_ROW_INVARIANT_BATCH);
        history_.compute(history_.n_evaluated(), stop, &llama_opt_stats::tokens_decoded, /* evict_sessions */ true,
                         /* logits */ false);
        history_.computed(stop);
    }
}
