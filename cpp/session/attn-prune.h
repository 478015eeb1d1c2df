#pragma once

// session/attn-prune: attention-sink pruning (000 §4.1, attn_prune_enabled, Tier 2).
// After a turn is computed, the attention of its last queries over every key (live and cold) is
// scored on the host (methods/attn-capture); cold blocks that score like kept ones come back (and
// the turn is computed again to see them), then the per-block rolling statistics are updated and
// blocks below the threshold for the window (or the weakest, over a budget) move to cold storage:
// their KV rows in RAM, their cells freed (holes of the history). Never the first block (attention
// sinks), the system prompt, the current turn or the last attn_prune_recent tokens.

#include "methods/attn-score.h"
#include "session/prefill.h"

#include <map>

// What a turn's attention scores were (attention_probe), for tests against a reference.
struct llama_opt_attn_probe {
    llama_opt_attn_shape   shape;
    std::vector<int32_t>   layers;     // the scored layers
    std::vector<llama_pos> q_pos;      // positions of the queries
    std::vector<float>     q;          // layers × queries × n_head × head_dim (before the attention scale)
    std::vector<llama_pos> k_pos;      // positions with KV
    std::vector<float>     k;          // layers × keys × n_head_kv × head_dim
    std::vector<float>     scores;     // by key: mean over layers of the max over heads, mean over queries
};

class llama_opt_session_attn_prune {
public:
    llama_opt_session_attn_prune(llama_opt_session_history & history, llama_opt_session_counters & counters,
                                 const llama_opt_approx_settings & approx, llama_opt_session_prefill & prefill)
        : history_(history), counters_(counters), approx_(approx), prefill_(prefill) {}

    // After the turn [turn_begin, n_evaluated) was computed with the capture armed; the system
    // prompt ends at `system_end`.
    void prune_turn(size_t turn_begin, size_t system_end);
    // The scores of the last computed queries over the history's keys (needs attn_prune_enabled).
    llama_opt_attn_probe probe() const;

    size_t n_cold() const { return cold_.size() * history_.ctx().block_size(); }  // tokens that can come back
    // The history's KV from `pos` on left: a block cut in part cannot come back whole.
    void   forget_from(size_t pos);
    // The KV of [p0, p1) is dropped for good: the cold blocks it touches are forgotten.
    void   forget_span(size_t p0, size_t p1);

private:
    bool restore_block(size_t block);  // a cold block back into the KV

    llama_opt_session_history &            history_;
    llama_opt_session_counters &           counters_;
    const llama_opt_approx_settings &      approx_;
    llama_opt_session_prefill &            prefill_;
    std::map<size_t, std::vector<uint8_t>> cold_;  // the KV rows of pruned blocks, by block
    llama_opt_attn_pruner                  pruner_{ 0.001f, 10 };
};
